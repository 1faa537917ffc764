"""Managed Postgres: a role that is not superuser, with REPLICATION and pg_create_subscription (PG16+),
owning the database, moves shards (publications name the tables). Without pg_monitor: the
walsenders' replay positions are hidden from it, and the slots tell how far the target applied. No
server log ever holds its password, even when the subscription cannot reach the publisher."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg
import pytest
from support.fleet import load, run_cli, sandbox_dir
from support.moves import check_moved, ids_on, load_rows, router_traffic

from shardctl.dev.sandbox import Sandbox
from shardctl.errors import OperationFailed
from shardctl.ops.move import MoveOptions, abort_move, move_shards

ADMIN_PASSWORD = "Adm1n-secret-4c1f"
MOVER_PASSWORD = "M0ver-secret-77aa"
ADMIN_ENV, MOVER_ENV = "SHARDCTL_TEST_ADMIN_PW", "SHARDCTL_TEST_MOVER_PW"


@pytest.fixture(scope="module")
def managed():
    """Two password-protected servers; the fleet's role ``mover`` owns the database, is no superuser."""
    os.environ[ADMIN_ENV], os.environ[MOVER_ENV] = ADMIN_PASSWORD, MOVER_PASSWORD
    box = Sandbox(sandbox_dir("managed"))
    box.up(hosts=2, shards=16, password_env=ADMIN_ENV)
    topo = load(box.topology_path)
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            db = conn.execute("SELECT current_database()").fetchone()[0]
            conn.execute(f"CREATE ROLE mover LOGIN REPLICATION PASSWORD '{MOVER_PASSWORD}'")
            conn.execute("GRANT pg_create_subscription TO mover")
            conn.execute(f'ALTER DATABASE "{db}" OWNER TO mover')
    text = box.topology_path.read_text()
    for host in topo.hosts:
        text = text.replace(host.dsn, host.dsn.replace("postgres@", "mover@"))
    box.topology_path.write_text(text.replace(ADMIN_ENV, MOVER_ENV))
    assert run_cli("init", config=box.topology_path).exit_code == 0
    yield box
    box.destroy()
    os.environ.pop(ADMIN_ENV, None)
    os.environ.pop(MOVER_ENV, None)


def server_logs(box: Sandbox) -> str:
    return "".join(p.read_text(errors="replace") for p in Path(box.dir).glob("*.log"))


def test_non_superuser_moves_under_load(managed):
    path = managed.topology_path
    topo = load(path)
    with psycopg.connect(**topo.host("pg1").connect_kwargs()) as conn:
        assert (
            conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]
            is False
        )
    moving = topo.host("pg1").shards[:4]
    load_rows(topo, moving, 100)
    before = ids_on(topo, "pg1", moving)
    with router_traffic(path, moving) as traffic:
        report = move_shards(load(path), moving, "pg2")
        time.sleep(0.3)
    assert report["phase"] == "cut_over" and report["verified"] is True
    # The reach probe would put the password in a failed statement, which this role cannot keep out of
    # the server log: it is not run, and the move says so.
    assert "preflight_reach" not in report
    assert any("is known when sync starts" in m for m in report["messages"]), report["messages"]
    check_moved(topo, path, moving, "pg1", "pg2", before, traffic, report)
    assert MOVER_PASSWORD not in server_logs(managed) and ADMIN_PASSWORD not in server_logs(managed)


def test_unreachable_publisher_leaks_no_password(managed):
    """The target cannot reach the source (a wrong --publisher-dsn port): the sync fails, the server logs
    say why, and neither log holds the password. The move aborts cleanly."""
    path = managed.topology_path
    topo = load(path)
    moving = topo.host("pg1").shards[:2]
    dsn = topo.host("pg1").dsn
    port = psycopg.conninfo.conninfo_to_dict(dsn)["port"]
    wrong = dsn.replace(f":{port}/", ":1/")
    with pytest.raises(OperationFailed):
        move_shards(topo, moving, "pg2", options=MoveOptions(publisher_dsn=wrong, sync_timeout=5))
    logs = server_logs(managed)
    assert "could not connect to the publisher" in logs or "REFRESH PUBLICATION" in logs
    assert MOVER_PASSWORD not in logs and ADMIN_PASSWORD not in logs
    assert abort_move(load(path), shards=moving)["phase"] == "aborted"


MOVES = "SELECT CASE WHEN to_regclass('shardctl.moves') IS NULL THEN 0 ELSE (SELECT count(*) FROM shardctl.moves) END"


def test_a_role_granted_the_log_setting_is_probed_and_a_wrong_publisher_refused_without_logging_it(
    managed,
):
    """With SET on log_min_error_statement granted, the reach probe runs for the non-superuser: a wrong
    --publisher-dsn port is refused in preflight (one line, nothing changed) and no log holds a password."""
    path = managed.topology_path
    topo = load(path)
    admin = topo.host("pg2").connect_kwargs()
    admin["conninfo"] = str(admin["conninfo"]).replace("mover@", "postgres@")
    admin["password"] = ADMIN_PASSWORD
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute("GRANT SET ON PARAMETER log_min_error_statement TO mover")
    try:
        moving = topo.host("pg1").shards[-2:]
        dsn = topo.host("pg1").dsn
        port = psycopg.conninfo.conninfo_to_dict(dsn)["port"]
        with psycopg.connect(**topo.host("pg1").connect_kwargs()) as conn:
            moves_before = conn.execute(MOVES).fetchone()[0]
        r = run_cli(
            "move-shard",
            f"{moving[0]}-{moving[-1]}",
            "--to",
            "pg2",
            "--publisher-dsn",
            dsn.replace(f":{port}/", ":1/"),
            config=path,
            env={MOVER_ENV: MOVER_PASSWORD},
        )
        assert r.exit_code == 1, r
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
        assert (
            len(errors) == 1
            and "preflight: host pg2 cannot reach host pg1 as a subscriber" in errors[0]
        ), r.stderr
        assert "(nothing was changed)" in errors[0]
        with psycopg.connect(**topo.host("pg1").connect_kwargs()) as conn:
            assert conn.execute(MOVES).fetchone()[0] == moves_before
        logs = server_logs(managed)
        assert MOVER_PASSWORD not in logs and ADMIN_PASSWORD not in logs
    finally:
        with psycopg.connect(**admin, autocommit=True) as conn:
            conn.execute("REVOKE SET ON PARAMETER log_min_error_statement FROM mover")
