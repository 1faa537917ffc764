"""``shardctl lint``: dangerous DDL in new migrations, by squawk (the ``squawk-cli`` wheel).

Each migration is rendered for one sample shard (and parsed, as ``migrate`` would), written to a
temporary file of the same name, and linted. Transactional files are linted with
``--assume-in-transaction`` (shardctl wraps each shard's migration in a transaction, so squawk's
rerun-safety advice does not apply to them); ``-- shardctl:no-transaction`` files without it (a
failed ``CREATE INDEX CONCURRENTLY`` is re-run as is, so ``IF NOT EXISTS`` matters there).

Then shardctl's own rules for schema-per-shard (``sql/shard_lint.py``: catalog lookups with no schema
filter, fixed schema qualifiers, database-wide statements, ``search_path``, ``CONCURRENTLY`` in a
transaction, sequences that bypass ``next_id()``) run over the same rendered text, on by default;
``lint: {exclude: [shard-search-path]}`` turns one off, like a squawk rule.

Rules shardctl turns off by default: the timeout rules. shardctl sets ``lock_timeout`` on every
migration connection (``--lock-timeout``) and ``statement_timeout`` with ``--statement-timeout``,
outside the file. The topology's ``lint:`` section adds exclusions, turns rules on (``include``;
also undoes a default exclusion) and sets ``pg_version``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadInput, MissingExtra
from ..model.documents import Result
from ..model.topology import Topology
from . import shard_lint
from .migrations import Migration, for_topology, load

DEFAULT_EXCLUDE = ("require-lock-timeout", "require-statement-timeout")


@dataclass
class Finding:
    file: str
    line: int
    column: int
    rule: str
    level: str
    message: str
    help: str | None = None
    # the migration succeeds on every shard yet leaves shards wrong (shard_lint.SILENTLY_WRONG): listed first
    silently_wrong: bool = False


@dataclass
class LintResult(Result):
    command = "lint"

    shard: int
    files: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    excluded_rules: list[str] = field(default_factory=list)
    included_rules: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings


def squawk_binary() -> str:
    """The ``squawk`` of this Python environment (the wheel puts it beside the interpreter), else PATH's."""
    beside = Path(sys.executable).parent / "squawk"
    if beside.is_file():
        return str(beside)
    found = shutil.which("squawk")
    if found is None:
        raise MissingExtra("shardctl lint (squawk)", "lint")
    return found


def rules(topo: Topology) -> tuple[list[str], list[str]]:
    """(excluded, included) rule names: shardctl's defaults adjusted by the topology's ``lint:``."""
    config = topo.lint or {}
    include = list(config.get("include", []))
    exclude = [r for r in DEFAULT_EXCLUDE if r not in include]
    exclude += [r for r in config.get("exclude", []) if r not in exclude]
    return exclude, [r for r in include if r not in exclude]


def shard_rules(topo: Topology) -> tuple[str, ...]:
    """shardctl's own rules that are on: all of them but those the topology's ``lint.exclude`` names."""
    off = set((topo.lint or {}).get("exclude", []))
    return tuple(r for r in shard_lint.RULES if r not in off)


def shard_findings(
    topo: Topology, migrations: list[Migration], shard: int = 0, texts: dict[str, str] | None = None
) -> list[Finding]:
    """shardctl's own rules over ``migrations`` rendered for ``shard`` (``texts``: file name → its
    rendering, when the caller has it)."""
    rules_on = shard_rules(topo)
    out = []
    for m in migrations:
        text = texts[m.name] if texts is not None else m.render(topo, shard)
        hits = shard_lint.check(
            text, topo.schema_name(shard), transactional=m.transactional, rules=rules_on
        )
        out += [
            Finding(
                m.name,
                h.line,
                h.column,
                h.rule,
                "error",
                h.message,
                h.help,
                h.rule in shard_lint.SILENTLY_WRONG,
            )
            for h in hits
        ]
    return out


def new_migrations(topo: Topology, base_dir: Path | None) -> list[Migration]:
    """The migrations a change adds: those after the base folder's head (every one without a base)."""
    head = for_topology(topo)
    if base_dir is None:
        return head
    if not Path(base_dir).is_dir():
        raise BadInput(
            f"--base {base_dir}: not a directory (check out the base branch's migrations folder)"
        )
    return [m for m in head if m.version > len(load(Path(base_dir)))]


def _run_squawk(paths: list[Path], args: list[str]) -> list[dict]:
    proc = subprocess.run(
        [squawk_binary(), "--reporter", "json", *args, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode not in (0, 1):
        first = (
            proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}"
        ).splitlines()[0]
        raise BadInput(
            f"squawk refused its arguments: {first} (check the topology's lint: section)"
        )
    try:
        return json.loads(proc.stdout or "[]")
    except json.JSONDecodeError:
        raise BadInput(f"squawk printed no JSON: {proc.stdout.strip()[:200]}") from None


def lint(topo: Topology, migrations: list[Migration], shard: int = 0) -> LintResult:
    """Lint ``migrations`` rendered for ``shard``; findings name the migration file and its line."""
    if not 0 <= shard < topo.shard_count:
        raise BadInput(f"--shard {shard}: shards run from 0 to {topo.shard_count - 1}")
    exclude, include = rules(topo)
    result = LintResult(
        shard, [m.name for m in migrations], excluded_rules=exclude, included_rules=include
    )
    if not migrations:
        return result
    texts = {m.name: m.render(topo, shard) for m in migrations}
    result.findings += shard_findings(topo, migrations, shard, texts)
    for m in migrations:
        try:
            m.sql(topo, shard)  # what migrate would refuse, refused here too
        except BadInput:
            # ... unless a rule of ours already names it with its line (CONCURRENTLY in a transaction).
            if not any(
                f.file == m.name and f.rule == shard_lint.CONCURRENTLY for f in result.findings
            ):
                raise
    common = []
    ours = set(shard_lint.RULES)
    if [r for r in exclude if r not in ours]:
        common.append("--exclude=" + ",".join(r for r in exclude if r not in ours))
    if [r for r in include if r not in ours]:
        common.append("--include=" + ",".join(r for r in include if r not in ours))
    if (topo.lint or {}).get("pg_version"):
        common.append(f"--pg-version={topo.lint['pg_version']}")
    with tempfile.TemporaryDirectory(prefix="shardctl-lint-") as tmp:
        groups: dict[bool, list[Path]] = {True: [], False: []}
        for m in migrations:
            path = Path(tmp) / m.name
            path.write_text(texts[m.name], encoding="utf-8")
            groups[m.transactional].append(path)
        raw = []
        for transactional, paths in groups.items():
            if paths:
                raw += _run_squawk(
                    paths, common + (["--assume-in-transaction"] if transactional else [])
                )
    for item in raw:
        result.findings.append(
            Finding(
                Path(item.get("file", "")).name,
                int(item.get("line", 0)) + 1,
                int(item.get("column", 0)) + 1,
                item.get("rule_name", "?"),
                str(item.get("level", "")).lower(),
                item.get("message", ""),
                item.get("help"),
            )
        )
    result.findings.sort(key=lambda f: (not f.silently_wrong, f.file, f.line, f.column, f.rule))
    return result
