"""Fleet helpers shared by bench/provision.py and bench/migrate.py: the floor's SQL files, the
schema-per-tenant way of applying them, fresh databases per candidate, and checks of the result."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import _common as c


def render_host_sql(
    topo,
    host,
    *,
    control: bool = True,
    create: bool = True,
    versions: set[int] | None = None,
    shards: list[int] | None = None,
) -> str:
    """What ``shardctl render --host NAME`` prints for ``host`` (the library's ``render_host``/``render_text``).

    ``versions`` limits the migrations (e.g. only the new one, for the migrate floor); ``create`` False
    leaves out the shard's infrastructure.
    """
    from shardctl.sql.migrations import for_topology
    from shardctl.sql.render import render_host, render_text

    migrations = [m for m in for_topology(topo) if versions is None or m.version in versions]
    doc = render_host(
        topo,
        host.shards if shards is None else shards,
        control=control,
        create=create,
        migrations=migrations,
    )
    return render_text(topo, {host.name: doc})


def write_floor_files(topo, directory: Path, tag: str, streams: int = 1, **kw) -> list[list[Path]]:
    """Per host (same order as ``topo.hosts``), ``streams`` SQL files over disjoint contiguous parts of
    its shards (the control schema, if asked for, in the first; the parts do not depend on it)."""
    control = kw.pop("control", True)
    out = []
    for host in topo.hosts:
        files = []
        n = len(host.shards)
        for k in range(streams):
            part = host.shards[k * n // streams : (k + 1) * n // streams]
            path = directory / f"{tag}_{host.name}_{k}.sql"
            path.write_text(
                render_host_sql(topo, host, shards=part, control=control and k == 0, **kw)
            )
            files.append(path)
        out.append(files)
    return out


def run_floor(box, databases: list[str], files: list[list[Path]]) -> float:
    """``psql -f`` per file: every host's files (one per stream), all at once."""
    ports = [h.port for h in box.state.hosts]
    return c.psql_files_parallel(
        box.state.bin_dir,
        [(port, db, path) for port, db, paths in zip(ports, databases, files) for path in paths],
    )


def default_streams() -> int:
    """K for the parallel floor: the cores of the machine the sandbox servers run on (this one)."""
    return os.cpu_count() or 1


def per_shard_transactions(topo, *, create: bool, above: int = 0) -> float:
    """The way schema-per-tenant tools do it: hosts one after another; for every shard a new connection
    and one transaction (its infrastructure, then each migration file as its own statement batch, with
    the same control rows shardctl records). Returns seconds."""
    import psycopg

    from shardctl.engine.executor import ShardPlan, transactional_sql
    from shardctl.sql.migrations import for_topology, steps_for
    from shardctl.sql.render import render_control, render_shard

    started = time.perf_counter()
    migrations = for_topology(topo)
    for host in topo.hosts:
        kwargs = host.connect_kwargs(connect_timeout=10, application_name="bench per-shard")
        if create:
            with psycopg.connect(**kwargs) as conn, conn.transaction():
                conn.execute(render_control(topo))
        for n in host.shards:
            schema = topo.schema_name(n)
            steps = steps_for(migrations, topo, n, above)
            with psycopg.connect(**kwargs) as conn, conn.transaction():
                if create:
                    conn.execute(transactional_sql(ShardPlan(n, schema, render_shard(topo, n)), []))
                for step in steps:
                    conn.execute(transactional_sql(ShardPlan(n, schema), [step]))
    return time.perf_counter() - started


def shardctl_cli(
    args: list[str], config: Path, timeout: float = 3600, base_env: dict | None = None
) -> tuple[float, subprocess.CompletedProcess]:
    """Run the ``shardctl`` command as a user would (a new Python process); returns (seconds, result).
    ``base_env``: the environment to start from (another checkout's: ``_common.against_env``)."""
    exe = Path(sys.executable).with_name("shardctl")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "shardctl.cli"]
    env = dict(base_env or os.environ, SHARDCTL_CONFIG=str(config), COLUMNS="120", NO_COLOR="1")
    started = time.perf_counter()
    out = subprocess.run(
        cmd + args, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    return time.perf_counter() - started, out


def count_objects(box, databases: list[str], prefix: str = "insta") -> list[tuple[int, int]]:
    """Per host: (shard schemas, tables in them)."""
    out = []
    for host, db in zip(box.state.hosts, databases):
        with c.connect(host.port, db) as conn:
            row = conn.execute(
                """SELECT (SELECT count(*) FROM pg_namespace WHERE nspname LIKE %(p)s),
                          (SELECT count(*) FROM pg_class k JOIN pg_namespace s ON s.oid = k.relnamespace
                            WHERE s.nspname LIKE %(p)s AND k.relkind = 'r')""",
                {"p": prefix + "%"},
            ).fetchone()
        out.append((row[0], row[1]))
    return out


def expect_fleet(box, databases: list[str], topo, tables_per_shard: int, label: str) -> None:
    """Fail loudly when a candidate did not build the whole fleet (a fast wrong answer is no answer)."""
    counts = count_objects(box, databases)
    for host, (schemas, tables) in zip(topo.hosts, counts):
        want = len(host.shards)
        if schemas != want or tables != want * tables_per_shard:
            raise SystemExit(
                f"{label}: host {host.name} has {schemas} shard schemas and {tables} tables; "
                f"expected {want} and {want * tables_per_shard}"
            )


def column_count(box, databases: list[str], table: str, column: str) -> int:
    """How many shard tables named ``table`` have ``column`` (over all hosts)."""
    total = 0
    for host, db in zip(box.state.hosts, databases):
        with c.connect(host.port, db) as conn:
            total += conn.execute(
                """SELECT count(*) FROM pg_attribute a JOIN pg_class k ON k.oid = a.attrelid
                     JOIN pg_namespace s ON s.oid = k.relnamespace
                    WHERE s.nspname LIKE 'insta%%' AND k.relname = %s AND a.attname = %s AND NOT a.attisdropped""",
                (table, column),
            ).fetchone()[0]
    return total
