"""A server as installed: every setting the sandbox changes put back to PostgreSQL's compiled default
(``pg_settings.boot_val``: max_connections 100, wal_level replica, no preloaded library, fsync on)
with ``ALTER SYSTEM`` and a restart, and a fleet role that is no superuser (it owns the database and
may create databases, as a managed service's main role does). init, migrate and verify work there,
and verify still proves the schema against the reference."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from support.fleet import load, run_cli, sandbox_dir
from support.migrations import add_migration, ledger, shards_with_column

from shardctl.dev.sandbox import Sandbox
from shardctl.dev.servers import SERVER_SETTINGS

# Needed to reach the server at all: left as the sandbox sets them.
REACH = {"listen_addresses", "unix_socket_directories", "port"}


def stock_dir(box: Sandbox, name: str) -> str:
    return next(h.data_dir for h in box.state.hosts if h.name == name)


@pytest.fixture(scope="module")
def stock():
    box = Sandbox(sandbox_dir("stock"))
    box.up(hosts=2, shards=16)
    topo = load(box.topology_path)
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET ALL")
            names = sorted(set(SERVER_SETTINGS) - REACH)
            for name, boot in conn.execute(
                "SELECT name, boot_val FROM pg_settings WHERE name = ANY(%s)", (names,)
            ).fetchall():
                conn.execute(
                    psycopg.sql.SQL("ALTER SYSTEM SET {} = {}").format(
                        psycopg.sql.Identifier(name), psycopg.sql.Literal(boot)
                    )
                )
            db = conn.execute("SELECT current_database()").fetchone()[0]
            conn.execute("CREATE ROLE app LOGIN CREATEDB NOSUPERUSER")
            conn.execute(
                psycopg.sql.SQL("ALTER DATABASE {} OWNER TO app").format(psycopg.sql.Identifier(db))
            )
        box.stop_host(host.name)
        # The sandbox preloads pg_stat_statements; ALTER SYSTEM cannot write an empty list (it
        # quotes '' as one empty name), so the stock empty list goes in as the server would write it.
        with (Path(stock_dir(box, host.name)) / "postgresql.auto.conf").open("a") as f:
            f.write("shared_preload_libraries = ''\n")
        box.start_host(host.name)
    box.topology_path.write_text(box.topology_path.read_text().replace("postgres@", "app@"))
    yield box
    box.destroy()


def test_init_migrate_verify_on_stock_settings_as_a_non_superuser(stock):
    path = stock.topology_path
    topo = load(path)
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            assert (
                conn.execute(
                    "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
                ).fetchone()[0]
                is False
            )
        # what the server runs with, read as the superuser (a plain role may not see every setting)
        with psycopg.connect(host.dsn.replace("app@", "postgres@"), autocommit=True) as conn:
            facts = conn.execute(
                "SELECT current_setting('max_connections'), current_setting('wal_level'), "
                "current_setting('shared_preload_libraries'), current_setting('fsync')"
            ).fetchone()
        assert facts == ("100", "replica", "", "on"), (host.name, facts)

    assert run_cli("init", config=path).exit_code == 0
    add_migration(
        path, "V0003__photo_note.sql", "ALTER TABLE {{ schema }}.photos ADD COLUMN note text;\n"
    )
    assert run_cli("migrate", "--check", config=path).exit_code == 1
    assert run_cli("migrate", config=path).exit_code == 0
    for host in topo.hosts:
        assert ledger(topo, host.name, 3) == set(host.shards)
        assert shards_with_column(topo, host.name, "photos", "note") == set(host.shards)
    verified = run_cli("verify", config=path)
    assert verified.exit_code == 0, verified
    assert "16 of 16 shards are what the migration files define" in verified.stdout, verified.stdout

    # verify proves against the reference here too: a shard without the column is named
    with psycopg.connect(**topo.host("pg2").connect_kwargs(), autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {topo.schema_name(9)}.photos DROP COLUMN note")
    wrong = run_cli("verify", config=path)
    assert wrong.exit_code == 1, wrong
    assert (
        "pg2 shard 9: missing column note on photos (V0003__photo_note.sql should have made it)"
        in (wrong.stderr)
    ), wrong.stderr
    assert "15 of 16 shards are what the migration files define" in wrong.stdout, wrong.stdout
