"""``shardctl sandbox up/status/down`` through the CLI, on servers of the test's own."""

from __future__ import annotations

import json
import shutil
import time

import psycopg
import pytest
from support.fleet import admin_dsn, load, run_cli, sandbox_dir

from shardctl.dev.servers import INITDB_CACHE_ENV


def error_line(result) -> str:
    """Failures print exactly one error line on stderr, never a traceback."""
    lines = [
        ln for ln in result.stderr.splitlines() if ln.strip() and not ln.startswith("warning: ")
    ]
    assert len(lines) == 1, result
    assert "Traceback" not in result.stderr, result
    return lines[0]


def test_sandbox_up_status_down_up_keeps_data_then_destroy(server_dir):
    box = server_dir / "box"
    try:
        up = run_cli("sandbox", "up", "--dir", box, "--hosts", "2", "--shards", "16", "--json")
        assert up.exit_code == 0, up
        doc = json.loads(up.stdout)
        assert doc["created"] == ["pg1", "pg2"] and doc["wrote_topology"] is True
        ports = [h["port"] for h in doc["hosts"]]
        assert len(set(ports)) == 2

        topo = load(box / "shardctl.yaml")
        assert topo.shard_count == 16 and [h.name for h in topo.hosts] == ["pg1", "pg2"]
        assert [len(h.shards) for h in topo.hosts] == [8, 8]

        status = run_cli("sandbox", "status", "--dir", box, "--json")
        assert status.exit_code == 0, status
        hosts = json.loads(status.stdout)["hosts"]
        assert [h["running"] for h in hosts] == [True, True] and all(h["pid"] for h in hosts)
        human = run_cli("sandbox", "status", "--dir", box)
        assert human.exit_code == 0 and "pg1" in human.stdout and "pg2" in human.stdout, human

        # The topology it wrote works: init, and a table of our own on pg2.
        assert run_cli("init", config=box / "shardctl.yaml").exit_code == 0
        with psycopg.connect(**topo.host("pg2").connect_kwargs(), autocommit=True) as conn:
            conn.execute("CREATE TABLE keepme (x int)")
            conn.execute("INSERT INTO keepme VALUES (7)")

        down = run_cli("sandbox", "down", "--dir", box)
        assert down.exit_code == 0, down
        assert "pg1" in down.stdout and "pg2" in down.stdout
        stopped = run_cli("sandbox", "status", "--dir", box, "--json")
        assert stopped.exit_code == 3, stopped
        assert [h["running"] for h in json.loads(stopped.stdout)["hosts"]] == [False, False]
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(**topo.host("pg2").connect_kwargs(connect_timeout=2))
        again_down = run_cli("sandbox", "down", "--dir", box)
        assert again_down.exit_code == 0 and "nothing running" in again_down.stdout, again_down

        again = run_cli("sandbox", "up", "--dir", box, "--hosts", "2", "--shards", "16", "--json")
        assert again.exit_code == 0, again
        doc = json.loads(again.stdout)
        assert doc["created"] == [] and doc["wrote_topology"] is False
        assert [h["port"] for h in doc["hosts"]] == ports
        with psycopg.connect(**topo.host("pg2").connect_kwargs()) as conn:
            assert conn.execute("SELECT x FROM keepme").fetchall() == [(7,)]
        verified = run_cli("verify", config=box / "shardctl.yaml")
        assert verified.exit_code == 0, verified

        destroyed = run_cli("sandbox", "down", "--dir", box, "--destroy")
        assert destroyed.exit_code == 0, destroyed
        assert not box.exists()
        gone = run_cli("sandbox", "status", "--dir", box)
        assert gone.exit_code == 2, gone
        assert "no sandbox in" in error_line(gone)
    finally:
        run_cli("sandbox", "down", "--dir", box, "--destroy")


def test_up_again_restarts_exactly_the_hosts_its_topology_names(server_dir):
    """A 1-host sandbox restarted with plain ``sandbox up`` (whose --hosts means 2 for a new one) gets
    its one server back, not a second one its shardctl.yaml does not name; asking for another count
    is refused and starts nothing."""
    box = server_dir / "one"
    try:
        up = run_cli("sandbox", "up", "--dir", box, "--hosts", "1", "--shards", "4", "--json")
        assert up.exit_code == 0, up
        for command in ("info", "init", "verify"):  # its topology has nothing to warn about
            said = run_cli(command, config=box / "shardctl.yaml")
            assert said.exit_code == 0 and "warning" not in said.stderr, (command, said)
        assert run_cli("sandbox", "down", "--dir", box).exit_code == 0
        again = run_cli("sandbox", "up", "--dir", box, "--json")
        assert again.exit_code == 0, again
        doc = json.loads(again.stdout)
        assert doc["created"] == [] and [h["name"] for h in doc["hosts"]] == ["pg1"], doc
        assert not (box / "pg2").exists()
        status = json.loads(run_cli("sandbox", "status", "--dir", box, "--json").stdout)
        assert [(h["name"], h["running"]) for h in status["hosts"]] == [("pg1", True)]

        two = run_cli("sandbox", "up", "--dir", box, "--hosts", "2")
        assert two.exit_code == 2, two
        assert "--hosts 2: the sandbox in" in error_line(two) and "has 1 host" in error_line(two)
        assert not (box / "pg2").exists()
        assert [h.name for h in load(box / "shardctl.yaml").hosts] == ["pg1"]
    finally:
        run_cli("sandbox", "down", "--dir", box, "--destroy")


def test_engine_docker_fails_clearly(tmp_path):
    result = run_cli("sandbox", "up", "--dir", tmp_path / "docker", "--engine", "docker")
    assert result.exit_code == 1, result
    line = error_line(result)
    assert (
        line.startswith("error: --engine docker")
        and "docker" in line.split("--engine docker", 1)[1]
    ), line
    assert not (tmp_path / "docker" / "sandbox.json").exists()


@pytest.mark.parametrize("docker_host", ["unix:///nonexistent/docker.sock", "tcp://127.0.0.1:1"])
def test_engine_docker_without_an_engine_says_so(tmp_path, docker_host):
    result = run_cli(
        "sandbox",
        "up",
        "--dir",
        tmp_path / "docker",
        "--engine",
        "docker",
        env={"DOCKER_HOST": docker_host},
    )
    assert result.exit_code == 1, result
    line = error_line(result)
    assert f"no Docker engine is reachable at {docker_host}" in line, line
    assert "use the default embedded engine" in line
    assert not (tmp_path / "docker").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--hosts", "0"],
        ["--hosts", "65"],
        ["--shards", "0"],
        ["--shards", "9000"],
        ["--hosts", "three"],
        ["--engine", "podman"],
        ["--function", "perl"],
    ],
)
def test_bad_arguments_exit_2_and_touch_nothing(tmp_path, args):
    box = tmp_path / "bad"
    result = run_cli("sandbox", "up", "--dir", box, *args)
    assert result.exit_code == 2, result
    assert "Traceback" not in result.stderr and result.stderr.strip(), result
    assert not box.exists()


def test_fewer_shards_than_hosts_is_bad_input(tmp_path):
    box = tmp_path / "bad"
    result = run_cli("sandbox", "up", "--dir", box, "--hosts", "3", "--shards", "2")
    assert result.exit_code == 2, result
    assert "--shards (2) must be at least --hosts (3)" in error_line(result)
    assert not (box / "sandbox.json").exists()


def test_hosts_are_made_together_and_a_failed_one_leaves_those_before_it_for_the_rerun(
    server_dir, monkeypatch
):
    """initdb runs for every new host at once; when one fails, the state records the hosts before it (names
    stay pg1..pgN), nothing is started, and the next ``up`` makes the rest (reusing a later host's data)."""
    from shardctl.dev.sandbox import Sandbox
    from shardctl.errors import OperationFailed

    real = Sandbox._initdb
    spans: list[tuple[float, float]] = []

    def pg2_fails(self, host, *args):
        started = time.monotonic()
        real(self, host, *args)
        spans.append((started, time.monotonic()))
        if host.name == "pg2":
            raise OperationFailed("initdb failed (exit 1): No space left on device")

    monkeypatch.setattr(Sandbox, "_initdb", pg2_fails)
    box = Sandbox(server_dir / "box")
    try:
        with pytest.raises(OperationFailed, match="No space left"):
            box.up(hosts=3, shards=3)
        assert [h.name for h in box.state.hosts] == ["pg1"]
        assert max(a for a, _ in spans) < min(b for _, b in spans), (
            spans
        )  # the three initdb ran at once
        assert not any(box.running(h) for h in box.state.hosts)
        monkeypatch.setattr(Sandbox, "_initdb", real)
        doc = box.up(hosts=3, shards=3)
        assert doc["created"] == ["pg2", "pg3"] and [h["name"] for h in doc["hosts"]] == [
            "pg1",
            "pg2",
            "pg3",
        ]
        assert len({h["port"] for h in doc["hosts"]}) == 3
        for host in doc["hosts"]:
            with psycopg.connect(host["dsn"]) as conn:
                assert conn.execute("SELECT current_database()").fetchone()[0] == "app"
    finally:
        box.destroy()


def _system_identifier(host: dict, **connect) -> int:
    with psycopg.connect(admin_dsn(host["port"]), connect_timeout=10, **connect) as conn:
        return conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()[0]


def test_new_servers_are_copies_of_one_cluster_initdb_made_per_build(monkeypatch, private_sandbox):
    """With SHARDCTL_INITDB_CACHE (the suite sets it), initdb runs once per build and each new server
    is a copy; a sandbox with a password is made by initdb itself (no password is ever cached)."""
    cache = sandbox_dir("initdb-cache-test")
    try:
        monkeypatch.setenv(INITDB_CACHE_ENV, str(cache))
        copies = private_sandbox(hosts=3, shards=3).status()["hosts"]
        clusters = [p.name for p in cache.iterdir() if not p.name.startswith(".")]
        assert len(clusters) == 1 and (cache / clusters[0] / "PG_VERSION").exists(), clusters
        # initdb draws a system identifier from the clock and its pid: three initdbs, three of them
        assert len({_system_identifier(h) for h in copies}) == 1

        monkeypatch.setenv("SHARDCTL_TEST_CACHE_PASSWORD", "not-in-the-cache")
        protected = private_sandbox(hosts=1, shards=1, password_env="SHARDCTL_TEST_CACHE_PASSWORD")
        host = protected.status()["hosts"][0]
        assert _system_identifier(host, password="not-in-the-cache") != _system_identifier(
            copies[0]
        )
        assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == clusters
    finally:
        shutil.rmtree(cache, ignore_errors=True)
