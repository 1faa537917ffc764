"""The host-level ledger (``shardctl.host_migrations``): what of the host-level history a host has.

One row per applied ``H`` file (version, description, checksum of its source, time taken, who),
beside the shard ledger in the control schema. Applied under the host's advisory lock (the caller
holds it), before any shard migration: each file in a transaction of its own with its row (a file
marked ``-- shardctl:no-transaction`` runs alone and is recorded after it succeeds), with
``search_path = public`` so extensions land where every shard's ``search_path`` sees them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import psycopg

from ..errors import OperationFailed
from ..model.topology import Host, Topology
from ..sql import session
from ..sql.catalog import ledger as ledger_q
from ..sql.host_migrations import EXT_SCHEMA, HostLevelMigration


@dataclass
class HostLevelState:
    """A host's host-level ledger compared with the files."""

    applied: dict[int, str] = field(default_factory=dict)  # version → stored checksum
    pending: list[int] = field(default_factory=list)  # versions still to run (up to the goal)
    drift: list[str] = field(default_factory=list)  # applied files whose source changed
    orphans: list[int] = field(default_factory=list)  # applied versions with no file
    gaps: list[int] = field(default_factory=list)  # versions missing below the highest applied

    def problems(self) -> list[str]:
        lines = [f"host-level migration {f} changed after it was applied" for f in self.drift]
        lines += [f"host-level H{v} missing from the host ledger" for v in self.gaps]
        return lines


def read_ledger(conn: psycopg.Connection) -> dict[int, str]:
    """version → checksum ({} when the host has no host-level ledger yet): one query on an autocommit
    connection (a host without the table answers with an error, which costs nothing there)."""
    query = ledger_q.HOST_LEDGER_ROWS
    if conn.autocommit:
        try:
            return dict(conn.execute(query).fetchall())
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return {}
    if not ledger_q.host_ledger_exists(conn):
        return {}
    return dict(conn.execute(query).fetchall())


def ensure_ledger(conn: psycopg.Connection) -> None:
    """Create the host-level ledger if missing (hosts initialised before it existed get it here)."""
    if not ledger_q.host_ledger_exists(conn):
        with conn.transaction():
            conn.execute(ledger_q.HOST_LEDGER_DDL)


def host_state(
    conn: psycopg.Connection, migrations: list[HostLevelMigration], goal: int | None = None
) -> HostLevelState:
    """Compare the host's ledger with ``migrations`` (pending: versions up to ``goal``, default all)."""
    state = HostLevelState(applied=read_ledger(conn))
    by_version = {m.version: m for m in migrations}
    goal = len(migrations) if goal is None else goal
    for v, stored in sorted(state.applied.items()):
        m = by_version.get(v)
        if m is None:
            state.orphans.append(v)
        elif stored != m.host_checksum():
            state.drift.append(m.name)
    top = max(state.applied, default=0)
    state.gaps = [v for v in range(1, top + 1) if v not in state.applied]
    state.pending = [
        m.version for m in migrations if m.version <= goal and m.version not in state.applied
    ]
    return state


def repair(
    conn: psycopg.Connection, migrations: list[HostLevelMigration], state: HostLevelState
) -> int:
    """Record the current checksum of changed host-level files. Returns the rows updated."""
    changed = [m for m in migrations if m.name in state.drift]
    with conn.transaction():
        for m in changed:
            ledger_q.set_host_checksum(conn, m.version, m.host_checksum())
    state.drift = []
    return len(changed)


def _run_one(
    conn: psycopg.Connection, m: HostLevelMigration, sql_text: str, lock_timeout: float | None
) -> None:
    settings = {"search_path": EXT_SCHEMA} | (
        {"lock_timeout": session.duration(lock_timeout)} if lock_timeout else {}
    )
    setup = session.settings_text(settings, local=m.transactional)
    record = ledger_q.HOST_LEDGER_RECORD
    started = time.perf_counter()
    if m.transactional:
        with conn.transaction():
            conn.execute(setup)
            conn.execute(sql_text)
            conn.execute(
                record,
                (
                    m.version,
                    m.description,
                    m.host_checksum(),
                    (time.perf_counter() - started) * 1000,
                ),
            )
        return
    conn.execute(setup)
    try:
        conn.execute(sql_text)
    finally:
        conn.execute(session.RESET_PATH_AND_LOCKS)
    with conn.transaction():
        conn.execute(
            record,
            (m.version, m.description, m.host_checksum(), (time.perf_counter() - started) * 1000),
        )


def apply(
    conn: psycopg.Connection,
    topo: Topology,
    host: Host,
    migrations: list[HostLevelMigration],
    *,
    goal: int | None = None,
    lock_timeout: float | None = 5.0,
) -> list[int]:
    """Bring ``host`` up to date with the host-level history (the caller holds the host lock on the
    autocommit ``conn``; ``lock_timeout`` in seconds). Returns the versions applied; OperationFailed
    names the file and the error, or refuses a ledger whose applied files changed (until ``migrate --repair``)."""
    if not migrations and not read_ledger(conn):
        return []
    ensure_ledger(conn)
    state = host_state(conn, migrations, goal)
    if state.drift:
        raise OperationFailed(
            f"host {host.name}: host-level migration {state.drift[0]} was changed after it "
            f"was applied; restore the file, or accept it with `shardctl migrate --repair --yes`"
        )
    if state.gaps:
        raise OperationFailed(
            f"host {host.name}: the host-level ledger has no H{state.gaps[0]} though later "
            f"versions are applied; shardctl will not apply them out of order"
        )
    done = []
    by_version = {m.version: m for m in migrations}
    for v in state.pending:
        m = by_version[v]
        text = m.sql(topo, host.name)
        try:
            _run_one(conn, m, text, lock_timeout)
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OperationFailed(
                f"host {host.name}: host-level migration {m.name} failed: {first} (no shard "
                f"migration ran on this host; fix the file and run again)"
            ) from None
        done.append(v)
    if done:
        from .ledger import log_event

        log_event(
            conn,
            "host-migrate",
            [],
            {"versions": done, "files": [by_version[v].name for v in done]},
        )
    return done
