"""Secrets never printed; hosts that accept TCP but never answer fail fast with exit 3."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.fleet import sandbox_dir
from support.process import run_shardctl as cli_process

from shardctl.dev.sandbox import Sandbox

PASSWORD = "Sw0rdf1sh-9f8e7d"
ENV = "SHARDCTL_TEST_PASSWORD"


@pytest.fixture(scope="module")
def protected():
    os.environ[ENV] = PASSWORD
    box = Sandbox(sandbox_dir("protected"))
    box.up(hosts=2, shards=16, password_env=ENV)
    yield box
    box.destroy()
    os.environ.pop(ENV, None)


def test_password_never_printed(protected, tmp_path):
    path = str(protected.topology_path)
    assert "password_env" in Path(path).read_text() and PASSWORD not in Path(path).read_text()
    commands = [
        ["init"],
        ["verify"],
        ["status"],
        ["migrate", "--check"],
        ["migrate", "--dry-run"],
        ["plan"],
        ["migrate"],
        ["info"],
        ["locate", "42"],
        ["render", "--shard", "3"],
        ["decode-id", "--layout", "pinterest", "1"],
    ]
    seen = []
    for command in commands:
        for extra in ([], ["--json"]):
            proc = cli_process("--config", path, *command, *extra)
            seen.append((command, extra, proc.returncode))
            assert PASSWORD not in proc.stdout + proc.stderr, (command, extra)
            if extra:
                json.loads(proc.stdout)
    assert all(code == 0 for _, _, code in seen), seen

    # Connection failures: a wrong password, and an unreachable host, with --debug tracebacks.
    wrong = cli_process("--debug", "--config", path, "status", env={ENV: "not-" + PASSWORD})
    assert wrong.returncode == 3 and "not-" + PASSWORD not in wrong.stdout + wrong.stderr
    assert "password authentication failed" in wrong.stderr
    text = Path(path).read_text().replace("127.0.0.1:", "127.0.0.1:1", 1)
    inline = protected.dir / "inline.yaml"
    inline.write_text(text.replace("postgresql://postgres@", f"postgresql://postgres:{PASSWORD}@"))
    refused = cli_process("--config", str(inline), "status", "--json")
    assert refused.returncode == 2 and PASSWORD not in refused.stdout + refused.stderr
    allowed = cli_process(
        "--debug",
        "--allow-inline-password",
        "--config",
        str(inline),
        "status",
        "--json",
        "--connect-timeout",
        "2",
    )
    assert allowed.returncode == 3, allowed
    assert PASSWORD not in allowed.stdout + allowed.stderr
    # Nothing the servers logged, nor the control schema's event log, holds it either.
    for log in protected.dir.glob("*.log"):
        assert PASSWORD not in log.read_text(errors="replace"), log


class SilentServer:
    """Accepts TCP connections and never says a word."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.held.append(conn)
            except OSError:
                continue

    def close(self):
        self.stop = True
        for c in self.held:
            c.close()
        self.sock.close()


@pytest.fixture
def silent():
    server = SilentServer()
    yield server
    server.close()


SILENT_COMMANDS = [["init"], ["status"], ["verify"], ["migrate", "--check"], ["migrate"]]


def test_silent_host_times_out_with_exit_3(make_fleet, silent):
    """Each command, a real process on a fleet of its own whose pg2 accepts TCP and never answers,
    ends with exit 3 naming pg2. The five run at once: each waits out its own connect timeout."""

    def silenced() -> Path:
        path = make_fleet(hosts=2, shards=8)
        head, tail = path.read_text().split("- name: pg2", 1)
        tail = tail.split("\n", 2)
        path.write_text(
            head
            + f'- name: pg2\n    dsn: "postgresql://postgres@127.0.0.1:{silent.port}/app"\n{tail[2]}'
        )
        return path

    def timed(command: list[str], path: Path) -> tuple[float, subprocess.CompletedProcess]:
        started = time.monotonic()
        proc = cli_process(*command, "--connect-timeout", "2", config=path)
        return time.monotonic() - started, proc

    paths = [silenced() for _ in SILENT_COMMANDS]
    with ThreadPoolExecutor(len(SILENT_COMMANDS)) as pool:
        runs = list(pool.map(timed, SILENT_COMMANDS, paths))
    for command, (elapsed, proc) in zip(SILENT_COMMANDS, runs):
        assert proc.returncode == 3, (command, proc)
        assert "pg2" in proc.stderr and "Traceback" not in proc.stderr, (command, proc)
        assert elapsed < 15, f"{command} took {elapsed:.1f}s with --connect-timeout 2"
