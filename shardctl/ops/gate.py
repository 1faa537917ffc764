"""``migrate --check --base DIR``: the pull-request gate, against the base branch's migrations folder.

A pull request passes when

1. every migration of the base branch is still there, unchanged (same name, same text);
2. the change only adds migrations after the base's head (versions base_head+1 …);
3. each new migration renders, parses and can run as shardctl runs it, for every shard, and passes
   shardctl's own schema-per-shard lint rules (sql/shard_lint.py; rendered for shard 0; the topology's
   ``lint.exclude`` turns a rule off);
4. the fleet is at the base's head: nothing of the base pending on any shard, no applied file
   edited (ledger checksums), no version the base does not have.

So a pull request that adds a migration is green (unlike a plain ``--check``, which lists it as
pending), and one that edits or removes an applied migration is red.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..engine import connections as db
from ..engine.executor import RunOptions
from ..engine.fanout import raise_unreachable
from ..errors import BadInput, OperationFailed, first_few
from ..model.documents import Result
from ..model.ranges import format_shards
from ..model.topology import Topology
from ..sql.host_migrations import HostLevelMigration, host_for_topology, load_host
from ..sql.lint import shard_findings
from ..sql.migrations import Migration, for_topology, load
from ..sql.render import shard_context
from .migrate import migrate


@dataclass
class GateResult(Result):
    command = "migrate --check --base"

    base_dir: str
    base_head: int
    head: int
    new: list[str] = field(default_factory=list)  # files the change adds
    problems: list[str] = field(default_factory=list)  # one line each; empty: the gate passes
    fleet: dict[str, dict[int, int]] = field(default_factory=dict)  # host → version → shards
    shards_rendered: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        fleet = {h: {str(v): n for v, n in c.items()} for h, c in self.fleet.items()}
        return {**super().to_dict(), "fleet": fleet}

    def raise_for_status(self) -> GateResult:
        """OperationFailed (exit 1) naming the first problem, when the gate does not pass."""
        if not self.ok:
            raise OperationFailed(f"gate: {first_few(self.problems, 1)}", report=self.to_dict())
        return self


def compare_files(base: list[Migration], head: list[Migration]) -> list[str]:
    """Problems with the base's migrations in the change: removed, renamed or edited."""
    by_version = {m.version: m for m in head}
    problems = []
    for b in base:
        h = by_version.get(b.version)
        if h is None:
            problems.append(
                f"{b.name} was removed; the base branch has it (applied migrations stay)"
            )
        elif h.name != b.name:
            problems.append(
                f"{b.name} was renamed to {h.name}; applied migrations keep their names"
            )
        elif h.source != b.source:
            problems.append(
                f"{b.name} changed after it was applied: it differs from the base branch's copy; "
                f"restore it and add a new migration instead"
            )
    return problems


def render_everywhere(topo: Topology, new: list[Migration]) -> tuple[list[str], int]:
    """Render, parse and check each new migration for every shard: (problems, renders)."""
    problems: dict[str, str] = {}
    count = 0
    for shard in range(topo.shard_count):
        context = shard_context(topo, shard)
        for m in new:
            if m.name in problems:
                continue
            try:
                m.sql(topo, shard, context)
                count += 1
            except BadInput as exc:
                problems[m.name] = f"shard {shard}: {exc}"
    return list(problems.values()), count


def host_level_problems(
    topo: Topology, base: list[HostLevelMigration], head: list[HostLevelMigration]
) -> list[str]:
    """The host-level files: the base's kept unchanged, new ones render and parse (for every host)."""
    problems = [
        p.replace(" was removed", " (host-level) was removed") for p in compare_files(base, head)
    ]
    for m in head[len(base) :]:
        for host in topo.hosts:
            try:
                m.sql(topo, host.name)
            except BadInput as exc:
                problems.append(f"host {host.name}: {exc}")
                break
    return problems


def fleet_problems(
    topo: Topology,
    base_head: int,
    hosts: list[str] | None,
    connect_timeout: int,
    host_head: int | None = None,
) -> tuple[list[str], dict[str, dict[int, int]]]:
    """Is the fleet at the base's head (and the base's host-level head)? Read-only: one ``migrate
    --check`` to the base's heads."""
    report = migrate(
        topo,
        target=base_head,
        hosts=hosts,
        check=True,
        host_target=host_head,
        options=RunOptions(connect_timeout=connect_timeout),
    )
    raise_unreachable(report.hosts, report.to_dict())
    problems: list[str] = []
    fleet: dict[str, dict[int, int]] = {}
    for h in report.hosts:
        if h.error:
            problems.append(f"{h.host}: {h.error}")
        d = report.host(h)
        fleet[h.host] = dict(d.versions)
        behind = ", ".join(f"V{v} on {n} shards" for v, n in d.pending.items())
        if behind:
            problems.append(
                f"{h.host}: the fleet is behind the base branch ({behind} pending): run migrate "
                f"on the base branch first"
            )
        ahead = {v: n for v, n in d.versions.items() if v > base_head}
        if ahead:
            problems.append(
                f"{h.host}: "
                + ", ".join(f"{n} shards at V{v}" for v, n in ahead.items())
                + f", which the base branch (head V{base_head}) does not have: update the base"
            )
        problems += [f"{h.host}: {line}" for line in d.ledger_problems()]
        problems += [
            f"{h.host}: V{v} is applied on shards {format_shards(s)} but its file is gone"
            for v, s in d.orphans.items()
        ]
        problems += [f"{h.host}: {line}" for line in d.held]
        if d.host_level.pending:
            problems.append(
                f"{h.host}: host-level "
                + ", ".join(f"H{v}" for v in d.host_level.pending)
                + " of the base branch not applied: run migrate on the base branch first"
            )
        problems += [
            f"{h.host}: host-level H{v} is applied but its file is gone"
            for v in d.host_level.orphans
            if host_head is None or v <= host_head
        ]
    return problems, fleet


def check_against_base(
    topo: Topology,
    base_dir: Path,
    *,
    hosts: list[str] | None = None,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
) -> GateResult:
    """The pull-request gate (see the module docstring). Touches nothing; problems are in the result."""
    started = time.perf_counter()
    if not Path(base_dir).is_dir():
        raise BadInput(
            f"--base {base_dir}: not a directory (check out the base branch's migrations folder)"
        )
    # a base folder that breaks the naming rules fails here too (exit 2)
    base = load(Path(base_dir))
    head = for_topology(topo)
    result = GateResult(str(base_dir), len(base), len(head))
    result.problems += compare_files(base, head)
    added = [m for m in head if m.version > len(base)]
    base_host, head_host = load_host(Path(base_dir)), host_for_topology(topo)
    result.new = [m.name for m in head_host[len(base_host) :]] + [m.name for m in added]
    result.problems += host_level_problems(topo, base_host, head_host)
    rendered, result.shards_rendered = render_everywhere(topo, added)
    result.problems += rendered
    if not rendered:
        result.problems += [
            f"{f.file}:{f.line} {f.rule}: {f.message} (fix: {f.help})"
            for f in shard_findings(topo, added)
        ]
    # An edited, removed or renamed base file is reported above; the fleet is still compared up to
    # what both folders hold.
    fleet, result.fleet = fleet_problems(
        topo, min(len(base), len(head)), hosts, connect_timeout, min(len(base_host), len(head_host))
    )
    result.problems += fleet
    result.seconds = time.perf_counter() - started
    return result
