"""``sandbox up --engine docker``: containers through testcontainers, and everything shardctl does on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from support.fleet import run_cli

from shardctl.dev.docker import LABEL, LABEL_DIR, DockerSandbox, docker_client
from shardctl.model.topology import Topology

IMAGE = os.environ.get("SHARDCTL_DOCKER_IMAGE", "local/shardctl-postgres:18")
APP = Path(__file__).resolve().parents[2] / "examples" / "app"


def docker_problem() -> str | None:
    """Why these tests cannot run here: no engine, or no local PostgreSQL image (make test-docker)."""
    from shardctl.dev.docker import engine_problem

    problem = engine_problem()
    if problem:
        return problem
    client = docker_client()
    try:
        client.images.get(IMAGE)
    except Exception:  # noqa: BLE001 - ImageNotFound or an API error: either way, no image
        return f"image {IMAGE} is not present (build it: make test-docker)"
    finally:
        client.close()
    return None


PROBLEM = docker_problem()
if (
    PROBLEM is not None and os.environ.get("SHARDCTL_DOCKER_REQUIRED") == "1"
):  # make test-docker, CI
    raise RuntimeError(f"SHARDCTL_DOCKER_REQUIRED=1 but the docker tests cannot run: {PROBLEM}")
# The reason is printed at the end of the run by shardctl.testing's summary of skipped docker tests.
pytestmark = [pytest.mark.docker, pytest.mark.skipif(PROBLEM is not None, reason=f"{PROBLEM}")]


@pytest.fixture
def image() -> str:
    return IMAGE


def labelled(kind: str, label: str) -> list:
    client = docker_client()
    try:
        if kind == "containers":
            return client.containers.list(all=True, filters={"label": label})
        return getattr(client, kind).list(filters={"label": label})
    finally:
        client.close()


def ok(*args, config=None):
    result = run_cli(*args, config=config)
    assert result.exit_code == 0, (args, result)
    return result


@pytest.fixture
def sandbox_dirs(tmp_path):
    dirs: list[Path] = []

    def make(name: str) -> Path:
        dirs.append(tmp_path / name)
        return dirs[-1]

    yield make
    for d in dirs:  # whatever a failed test left behind
        if (d / "docker.json").exists():
            DockerSandbox(d).destroy()


def test_three_containers_init_migrate_verify_move_and_destroy(image, sandbox_dirs):
    box, other = sandbox_dirs("fleet"), sandbox_dirs("other")
    up = json.loads(
        ok(
            "sandbox",
            "up",
            "--engine",
            "docker",
            "--hosts",
            "3",
            "--shards",
            "24",
            "--image",
            image,
            "--dir",
            box,
            "--json",
        ).stdout
    )
    assert [h["name"] for h in up["hosts"]] == ["pg1", "pg2", "pg3"] and up["wrote_topology"]
    assert up["version"].split(".")[0].isdigit(), (
        up
    )  # the image's PostgreSQL, as the server reports it
    ok("sandbox", "up", "--engine", "docker", "--hosts", "1", "--image", image, "--dir", other)
    config = box / "shardctl.yaml"
    topo = Topology.load(config)
    assert [h.peer_dsn for h in topo.hosts] == [
        f"postgresql://postgres@pg{i}:5432/app" for i in (1, 2, 3)
    ]
    with psycopg.connect(**topo.hosts[0].connect_kwargs()) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (["wal_level", "max_replication_slots", "max_wal_senders", "fsync"],),
            )
        )
    assert settings == {
        "wal_level": "logical",
        "max_replication_slots": "20",
        "max_wal_senders": "20",
        "fsync": "off",
    }

    ok("init", config=config)
    ok("migrate", config=config)
    ok("verify", config=config)
    with psycopg.connect(**topo.host("pg1").connect_kwargs(), autocommit=True) as conn:
        for shard in range(8):
            conn.execute(
                f"INSERT INTO insta{shard}.users (username) SELECT 'u' || g FROM generate_series(1, 20) g"
            )
    ok(
        "move-shard", "0-7", "--to", "pg3", config=config
    )  # 8 shards, subscriptions over the container network
    moved = Topology.load(config)
    assert all(moved.host_of(n).name == "pg3" for n in range(8))
    with psycopg.connect(**moved.host("pg3").connect_kwargs()) as conn:
        assert conn.execute("SELECT count(*) FROM insta7.users").fetchone()[0] == 20
    ok("verify", config=config)

    status = json.loads(ok("sandbox", "status", "--dir", box, "--json").stdout)
    assert all(h["running"] for h in status["hosts"]) and status["engine"] == "docker"
    ok("sandbox", "down", "--dir", box)
    assert run_cli("sandbox", "status", "--dir", box).exit_code == 3
    ok(
        "sandbox", "up", "--engine", "docker", "--dir", box
    )  # the same containers again: the data is kept
    ok("verify", config=config)

    sid = json.loads((box / "docker.json").read_text())["sandbox_id"]
    assert len(labelled("containers", f"{LABEL}={sid}")) == 3
    assert len(labelled("volumes", f"{LABEL}={sid}")) == 3
    ok("sandbox", "down", "--destroy", "--dir", box)
    for kind in ("containers", "volumes", "networks"):
        assert labelled(kind, f"{LABEL}={sid}") == [], kind
        assert labelled(kind, f"{LABEL_DIR}={box.resolve()}") == [], kind
    assert not box.exists()
    # Exactly its own: the other sandbox's container is untouched.
    assert [c.status for c in labelled("containers", f"{LABEL_DIR}={other.resolve()}")] == [
        "running"
    ]
    ok("sandbox", "down", "--destroy", "--dir", other)
    assert labelled("containers", f"{LABEL_DIR}={other.resolve()}") == []


def test_a_password_protected_fleet_moves_with_the_password_from_the_environment(
    image, sandbox_dirs, monkeypatch
):
    monkeypatch.setenv("SHARDCTL_TEST_PW", "Docker-Secret-9")
    box = sandbox_dirs("pw")
    result = ok(
        "sandbox",
        "up",
        "--engine",
        "docker",
        "--hosts",
        "2",
        "--shards",
        "4",
        "--image",
        image,
        "--dir",
        box,
        "--password-env",
        "SHARDCTL_TEST_PW",
    )
    assert "Docker-Secret-9" not in result.stdout + result.stderr
    config = box / "shardctl.yaml"
    topo = Topology.load(config)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(topo.hosts[0].dsn, connect_timeout=5).close()
    ok("init", config=config)
    result = ok("move-shard", "0", "--to", "pg2", config=config)
    assert "Docker-Secret-9" not in result.stdout + result.stderr
    ok("verify", config=config)


def test_a_missing_image_fails_before_anything_is_created(sandbox_dirs):
    box = sandbox_dirs("noimage")
    result = run_cli(
        "sandbox", "up", "--engine", "docker", "--image", "local/no-such-image:1", "--dir", box
    )
    assert result.exit_code == 1
    assert "image local/no-such-image:1 is not available locally" in result.stderr, result
    assert not box.exists()


def test_the_example_app_passes_on_the_docker_engine(image):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--shardctl-engine",
            "docker",
            "--shardctl-image",
            image,
        ],
        check=False,
        cwd=APP,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout


def test_a_container_removed_behind_its_back_is_reported_and_destroy_still_cleans_up(
    image, sandbox_dirs
):
    box = sandbox_dirs("gone")
    ok(
        "sandbox",
        "up",
        "--engine",
        "docker",
        "--hosts",
        "1",
        "--shards",
        "2",
        "--image",
        image,
        "--dir",
        box,
    )
    sid = json.loads((box / "docker.json").read_text())["sandbox_id"]
    for container in labelled("containers", f"{LABEL}={sid}"):
        container.remove(force=True)
    result = run_cli("sandbox", "up", "--engine", "docker", "--dir", box)
    assert (
        result.exit_code == 1 and "its container" in result.stderr and "is gone" in result.stderr
    ), result
    assert run_cli("sandbox", "status", "--dir", box).exit_code == 3
    ok("sandbox", "down", "--destroy", "--dir", box)
    for kind in ("containers", "volumes", "networks"):
        assert labelled(kind, f"{LABEL}={sid}") == [], kind
