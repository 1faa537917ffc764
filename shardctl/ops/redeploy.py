"""``redeploy``: bring every shard's template functions up to the current rendering, online.

What is re-deployable: the ``CREATE OR REPLACE FUNCTION`` / ``PROCEDURE`` statements of the per-shard
template (``shard.sql.j2`` with its includes, the topology's own templates first): ``next_id()`` in
either flavour (``id.function: plpgsql | sql``) and any function a team adds to its templates. The
rest of the template (schema, sequence) runs once at creation; change those with a migration.

A function is stale when the catalog's language or body (``pg_proc.prosrc``) differs from the
rendering, which is exactly what ``verify`` compares. Each stale shard is replaced in a transaction
of its own (``CREATE OR REPLACE`` takes no table lock, so writers calling ``next_id()`` go on), with
its row in ``shardctl.templates`` (shard, object, checksum, when, who); one ``redeploy`` event per
host goes to ``shardctl.events``.

Refused, before anything changes on any host: a ``next_id()`` whose replacement would mint IDs
under another layout or epoch. The deployed function mints one ID per shard and the topology's
layout decodes it; a wrong shard or a time off the host clock means the layout or epoch changed,
and existing IDs would no longer decode to their shard and time (new ones could collide with them).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import psycopg

from ..engine import connections as db
from ..engine.defaults import REDEPLOY_LOCK_TIMEOUT
from ..engine.executor import INTERRUPTED
from ..engine.fanout import HostResult, fan_out, select_hosts, stop_on_ctrl_c
from ..engine.ledger import log_event
from ..errors import BadInput, HostUnreachable, Interrupted, OperationFailed, first_few
from ..model.documents import Result
from ..model.ranges import format_shards
from ..model.topology import Host, Topology
from ..sql.catalog.control import control_exists, ensure_template_ledger, record_template
from ..sql.catalog.inspect import function_sources, present_schemas
from ..sql.catalog.verify import mint_one_id
from ..sql.migrations import parse
from ..sql.render import render_shard
from ..sql.session import duration, set_settings

TOLERANCE_MS = 5000


@dataclass(frozen=True)
class TemplateFunction:
    """One re-deployable statement of a shard's rendered template."""

    object: str  # e.g. "next_id/0": name and argument count, the same on every shard
    schema: str
    name: str
    nargs: int
    language: str
    body: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def _option(node: dict, name: str) -> object:
    for o in node.get("options", []):
        d = o.get("DefElem", {})
        if d.get("defname") == name:
            return d.get("arg")
    return None


def template_functions(topo: Topology, shard: int) -> list[TemplateFunction]:
    """The re-deployable functions of shard ``shard``'s rendered template."""
    schema = topo.schema_name(shard)
    out = []
    for st in parse(render_shard(topo, shard), tree=True):
        node = st.node
        if st.kind != "CreateFunctionStmt" or not node.get("replace"):
            continue
        names = [n["String"]["sval"] for n in node["funcname"]]
        language = (_option(node, "language") or {}).get("String", {}).get("sval", "sql")
        body_items = (_option(node, "as") or {}).get("List", {}).get("items", [])
        if len(body_items) != 1:  # C functions (file, symbol) and BEGIN ATOMIC bodies: not compared
            continue
        nargs = sum(
            1
            for p in node.get("parameters", [])
            if p["FunctionParameter"].get("mode") not in ("FUNC_PARAM_OUT", "FUNC_PARAM_TABLE")
        )
        out.append(
            TemplateFunction(
                f"{names[-1]}/{nargs}",
                names[0] if len(names) > 1 else schema,
                names[-1],
                nargs,
                language.lower(),
                body_items[0]["String"]["sval"],
                st.sql,
            )
        )
    return out


@dataclass
class TemplateState:
    """What redeploy found and did on one host (the ``value`` of its HostResult)."""

    stale: dict[str, list[int]] = field(default_factory=dict)  # object → shards whose copy differs
    refused: list[str] = field(default_factory=list)
    deployed: list[int] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    not_started: list[int] = field(default_factory=list)  # left by Ctrl-C

    def to_dict(self) -> dict:
        return {
            "stale": {o: format_shards(s) for o, s in self.stale.items()},
            "refused": self.refused,
            "deployed": format_shards(self.deployed),
            "deployed_count": len(self.deployed),
            "failed": self.failed,
            "not_started": format_shards(self.not_started),
        }


@dataclass
class RedeployReport(Result):
    command = "redeploy"

    hosts: list[HostResult[TemplateState]]
    dry_run: bool
    seconds: float = 0.0
    interrupted: bool = False  # Ctrl-C stopped it between two shards

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(
            h.ok and not h.value.failed and not h.value.refused for h in self.hosts
        )

    def raise_for_status(self) -> RedeployReport:
        """Exit 130 (Interrupted) after Ctrl-C; 3 (HostUnreachable) for a host that did not answer; 1
        (OperationFailed) for failed or refused shards, naming the first reason."""
        if self.interrupted:
            done = sum(len(h.value.deployed) for h in self.hosts)
            left = sum(len(h.value.not_started) for h in self.hosts)
            raise Interrupted(
                f"redeploy: interrupted (Ctrl-C): stopped at a shard boundary; {done} shard(s) "
                f"done, {left} not started; run shardctl redeploy again to finish",
                report=self.to_dict(),
            )
        down = [h for h in self.hosts if not h.reachable]
        if down:
            raise HostUnreachable(
                ", ".join(h.host for h in down),
                down[0].error or "unreachable",
                report=self.to_dict(),
            )
        if not self.ok:
            failed = sum(len(h.value.failed) for h in self.hosts)
            first = next((h for h in self.hosts if h.error or h.value.failed), None)
            why = (
                first.error
                if first and first.error
                else (first.value.failed[0]["error"] if first else "")
            )
            raise OperationFailed(
                f"redeploy: {failed} shard(s) failed; {why}", report=self.to_dict()
            )
        return self


def _stale(
    conn: psycopg.Connection, topo: Topology, host: Host
) -> tuple[dict[int, list[TemplateFunction]], set[int]]:
    """(shard → its template functions that differ from the catalog, shards that have a next_id())
    for the host's present shards."""
    schemas = [topo.schema_name(n) for n in host.shards]
    present = present_schemas(conn, schemas)
    catalog = function_sources(conn, sorted(present))
    out: dict[int, list[TemplateFunction]] = {}
    minting: set[int] = set()
    for n in host.shards:
        schema = topo.schema_name(n)
        if schema not in present:
            continue  # not created (init's business; verify reports it)
        if (schema, "next_id", 0) in catalog:
            minting.add(n)
        differ = [
            f
            for f in template_functions(topo, n)
            if catalog.get((f.schema, f.name, f.nargs)) != (f.language, f.body)
        ]
        if differ:
            out[n] = differ
    return out, minting


def _id_refusals(conn: psycopg.Connection, topo: Topology, shards: list[int]) -> list[str]:
    """Shards whose deployed next_id() mints IDs the topology's layout decodes wrongly."""
    refusals = []
    for i in range(0, len(shards), 256):
        chunk = shards[i : i + 256]
        schemas = [topo.schema_name(n) for n in chunk]
        for shard, minted, at_ms in mint_one_id(conn, schemas, chunk):
            try:
                d = topo.layout.decode(minted)
            except BadInput as exc:
                refusals.append(
                    f"shard {shard}: its next_id() mints {minted}, which the topology's layout "
                    f"cannot decode ({exc})"
                )
                continue
            if d["shard"] != shard or abs(d["unix_ms"] - at_ms) > TOLERANCE_MS:
                refusals.append(
                    f"shard {shard}: its next_id() mints IDs that the topology's {topo.layout.name} layout "
                    f"decodes to shard {d['shard']} at {d.get('time')}: the layout or epoch changed since "
                    f"it was deployed; re-deploying would break existing IDs (they would no longer decode to "
                    f"their shard and time, and new IDs could collide with them); restore id.layout/id.epoch"
                )
    return refusals


def _plan_host(
    conn: psycopg.Connection,
    topo: Topology,
    host: Host,
    result: TemplateState,
    *,
    id_checks: int | None = None,
) -> dict[int, list[TemplateFunction]]:
    """Find the host's stale functions (into ``result.stale``) and any layout/epoch refusal.

    The refusal check mints one ID on each shard whose next_id() is to be replaced, at most
    ``id_checks`` of them (None: all; a dry run checks one: a layout or epoch change is fleet-wide)."""
    stale, minting = _stale(conn, topo, host)
    for n, funcs in stale.items():
        for f in funcs:
            result.stale.setdefault(f.object, []).append(n)
    replacing = sorted(
        n
        for n, funcs in stale.items()
        if n in minting and any(f.object == "next_id/0" for f in funcs)
    )
    result.refused = _id_refusals(
        conn, topo, replacing if id_checks is None else replacing[:id_checks]
    )
    return stale


def _apply_host(
    conn: psycopg.Connection,
    stale: dict[int, list[TemplateFunction]],
    lock_timeout: float,
    result: TemplateState,
) -> None:
    """One transaction per shard: its functions and their ledger rows."""
    ensure_template_ledger(conn)
    for n in sorted(stale):
        if INTERRUPTED.is_set():  # Ctrl-C: between two shards (stop_on_ctrl_c)
            result.not_started = sorted(m for m in stale if m >= n)
            break
        try:
            with conn.transaction():
                set_settings(conn, {"lock_timeout": duration(lock_timeout)})
                for f in stale[n]:
                    conn.execute(f.sql)
                    record_template(conn, n, f.object, f.checksum)
            result.deployed.append(n)
        except psycopg.Error as exc:
            if conn.broken:
                raise
            result.failed.append({"shard": n, "error": db.first_line(exc)})
    if result.deployed or result.failed:
        log_event(
            conn,
            "redeploy",
            result.deployed,
            {
                "objects": sorted(result.stale),
                "deployed": len(result.deployed),
                "failed": len(result.failed),
            },
        )


def redeploy(
    topo: Topology,
    *,
    hosts: list[str] | None = None,
    dry_run: bool = False,
    lock_timeout: float = REDEPLOY_LOCK_TIMEOUT,
    wait: float = 0,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
) -> RedeployReport:
    """Re-deploy stale template functions on every shard (``dry_run``: only report them);
    ``lock_timeout`` and ``wait`` in seconds.

    Raises BadInput, before any change on any host, when a layout or epoch change would break IDs."""
    started = time.perf_counter()
    render_shard(topo, 0)  # a template that does not render fails here, before any connection
    selected = select_hosts(topo, hosts)

    def inspect(host: Host, result: HostResult[TemplateState]) -> None:
        with db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, purpose="redeploy"
        ) as conn:
            _plan_host(conn, topo, host, result.value, id_checks=1 if dry_run else None)

    results = fan_out(selected, inspect, lambda h: TemplateState())
    refused = [r for res in results for r in res.value.refused]
    if refused:
        raise BadInput(
            f"redeploy refused, nothing changed: {first_few(refused, 1, more='more shards')}"
        )
    busy = [h for h, res in zip(selected, results) if res.ok and res.value.stale]
    if dry_run or not busy:
        return RedeployReport(results, dry_run, time.perf_counter() - started)
    with (
        stop_on_ctrl_c() as ctrl_c,
        db.FleetLocks(
            busy, wait=wait, connect_timeout=connect_timeout, purpose="redeploy"
        ) as locks,
    ):

        def apply(host: Host, result: HostResult[TemplateState]) -> None:
            with locks.use(host) as conn:
                if not control_exists(conn):
                    raise OperationFailed(
                        f"host {host.name} has no shardctl control schema; run `shardctl init`"
                    )
                # Again under the host's lock (IDs were checked on every shard above).
                stale = _plan_host(conn, topo, host, result.value, id_checks=0)
                _apply_host(conn, stale, lock_timeout, result.value)

        applied = {r.host: r for r in fan_out(busy, apply, lambda h: TemplateState())}
    final = [applied.get(r.host, r) for r in results]
    return RedeployReport(final, dry_run, time.perf_counter() - started, ctrl_c.pressed)
