"""DSNs per purpose: ``dsn`` (applications, the Router), ``admin_dsn`` (shardctl itself), ``peer_dsn``
(other hosts' subscriptions during a move). Each path is made observable by a small TCP proxy of
this test's own in front of a server: the proxy counts the connections it carries.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path

import psycopg
import pytest
from support.fleet import run_cli

from shardctl.model.topology import Topology
from shardctl.router import Router


class TcpProxy:
    """127.0.0.1:<port> → 127.0.0.1:<target>, counting connections and remembering its upstream ports."""

    def __init__(self, target: int):
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.upstream_ports: set[int] = set()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += 1
                self.upstream_ports.add(upstream.getsockname()[1])
                self._open += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()
        with self._lock:
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


@pytest.fixture
def proxies():
    made: list[TcpProxy] = []

    def make(target: int) -> TcpProxy:
        made.append(TcpProxy(target))
        return made[-1]

    yield make
    for p in made:
        p.close()


DSN_LINE = re.compile(r'^    dsn: "postgresql://postgres@127\.0\.0\.1:(\d+)/(\w+)"$', re.MULTILINE)


def split_dsns(path: Path, proxies, peer: bool = False) -> dict[str, dict[str, TcpProxy]]:
    """Rewrite a fleet topology: ``dsn`` through an app proxy, ``admin_dsn`` direct and, with
    ``peer``, ``peer_dsn`` through a peer proxy. Returns each host's proxies by purpose."""
    made: dict[str, dict[str, TcpProxy]] = {}

    def rewrite(m: re.Match) -> str:
        port, db = int(m.group(1)), m.group(2)
        name = f"pg{len(made) + 1}"
        made[name] = {"app": proxies(port)}
        lines = [
            f'    dsn: "postgresql://postgres@127.0.0.1:{made[name]["app"].port}/{db}"',
            f'    admin_dsn: "postgresql://postgres@127.0.0.1:{port}/{db}"',
        ]
        if peer:
            made[name]["peer"] = proxies(port)
            lines.append(
                f'    peer_dsn: "host=127.0.0.1 port={made[name]["peer"].port} dbname={db} user=postgres"'
            )
        return "\n".join(lines)

    path.write_text(DSN_LINE.sub(rewrite, path.read_text()))
    return made


def test_the_router_uses_dsn_and_shardctl_uses_admin_dsn(make_fleet, proxies):
    path = make_fleet(hosts=2, shards=8)
    made = split_dsns(path, proxies)
    for command in (["init"], ["migrate"], ["verify"], ["status"], ["migrate", "--check"]):
        result = run_cli(*command, config=path)
        assert result.exit_code == 0, (command, result)
    assert [p["app"].connections for p in made.values()] == [0, 0], (
        "shardctl went through the app DSN"
    )

    topo = Topology.load(path)
    with Router(topo) as router:
        ids = {}
        for key in range(8):
            ids[key] = router.execute(
                key, "INSERT INTO users (username) VALUES (%s) RETURNING id", (f"u{key}",)
            )[0][0]
        for host in topo.hosts:
            # The server sees the Router's sessions arrive from the app proxy's upstream sockets.
            with psycopg.connect(**host.connect_kwargs(purpose="admin"), autocommit=True) as conn:
                ports = {
                    r[0]
                    for r in conn.execute(
                        "SELECT client_port FROM pg_stat_activity WHERE application_name = 'shardctl router' "
                        "AND datname = current_database()"
                    )
                }
            assert ports and ports <= made[host.name]["app"].upstream_ports, (host.name, ports)
    assert all(p["app"].connections >= 1 for p in made.values())
    before = [p["app"].connections for p in made.values()]
    assert run_cli("verify", config=path).exit_code == 0
    assert [p["app"].connections for p in made.values()] == before


def test_a_move_subscribes_through_the_source_peer_dsn(make_fleet, proxies):
    path = make_fleet(hosts=2, shards=8)
    made = split_dsns(path, proxies, peer=True)
    assert run_cli("init", config=path).exit_code == 0
    source = Topology.load(path).host("pg1")
    with psycopg.connect(**source.connect_kwargs(purpose="admin"), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO insta0.users (username) SELECT 'u' || g FROM generate_series(1, 50) g"
        )
    app_before = {n: p["app"].connections for n, p in made.items()}

    result = run_cli("move-shard", "0-1", "--to", "pg2", config=path)
    assert result.exit_code == 0, result
    assert made["pg1"]["peer"].connections >= 1, "the subscription did not use pg1's peer_dsn"
    assert made["pg2"]["peer"].connections == 0  # pg2 published nothing
    assert {n: p["app"].connections for n, p in made.items()} == app_before, (
        "the move used an app DSN"
    )
    target = Topology.load(path).host("pg2")
    with psycopg.connect(**target.connect_kwargs(purpose="admin")) as conn:
        assert conn.execute("SELECT count(*) FROM insta0.users").fetchone()[0] == 50


BASE = """version: 1
id: {layout: instagram, epoch: "2026-01-01T00:00:00Z"}
shards: {count: 4}
hosts:
  - name: a
    dsn: "postgresql://app@app-pool:6432/app"
    %s
    shards: "0-1"
  - name: b
    dsn: "host=b dbname=app"
    shards: "2-3"
"""


def test_each_dsn_defaults_to_the_one_before_it():
    topo = Topology.from_text(BASE % 'admin_dsn: "postgresql://admin@a-direct:5432/app"')
    a, b = topo.host("a"), topo.host("b")
    assert a.dsn_for("app") == "postgresql://app@app-pool:6432/app"
    assert a.dsn_for("admin") == a.dsn_for("peer") == "postgresql://admin@a-direct:5432/app"
    assert b.dsn_for("app") == b.dsn_for("admin") == b.dsn_for("peer") == "host=b dbname=app"
    assert a.connect_kwargs(purpose="admin")["conninfo"] == "postgresql://admin@a-direct:5432/app"
    assert a.connect_kwargs()["conninfo"] == "postgresql://app@app-pool:6432/app"
    topo = Topology.from_text(BASE % 'peer_dsn: "host=10.0.0.5 dbname=app"')
    a = topo.host("a")
    assert a.dsn_for("admin") == "postgresql://app@app-pool:6432/app"
    assert a.dsn_for("peer") == "host=10.0.0.5 dbname=app"
    with pytest.raises(ValueError, match="unknown DSN purpose"):
        a.dsn_for("replica")


@pytest.mark.parametrize(
    "line, problem",
    [
        ("admin_dsn: 42", "host a: admin_dsn must be a libpq connection string"),
        ('peer_dsn: ""', "host a: peer_dsn must be a libpq connection string"),
        ('peer_dsn: "host=x port"', "host a: peer_dsn is not a valid libpq connection string"),
        (
            'admin_dsn: "postgresql://u:Sekr3tPw@h/app"',
            "host a: admin_dsn contains a literal password",
        ),
        ('peer_dsn: "host=h password=Sekr3tPw"', "host a: peer_dsn contains a literal password"),
        ('replica_dsn: "host=h"', "unknown key 'replica_dsn' in hosts[0]"),
    ],
)
def test_bad_per_purpose_dsns_are_reported_with_their_line(tmp_path, line, problem):
    path = tmp_path / "shardctl.yaml"
    path.write_text(BASE % line)
    result = run_cli("info", config=path)
    assert result.exit_code == 2, result
    assert problem in result.stderr and f"{path}:7:" in result.stderr, result.stderr
    assert "Sekr3tPw" not in result.stderr + result.stdout


def test_every_dsn_is_masked_in_output(tmp_path):
    path = tmp_path / "shardctl.yaml"
    path.write_text(
        BASE % 'admin_dsn: "postgresql://admin:Hunter2Admin@a-direct/app"\n'
        '    peer_dsn: "host=a-peer dbname=app password=Hunter2Peer"'
    )
    for extra in ([], ["--json"]):
        result = run_cli("--config", path, "--allow-inline-password", "info", *extra)
        assert result.exit_code == 0, result
        assert "Hunter2" not in result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["hosts"][0]["admin_dsn"] == "postgresql://admin:***@a-direct/app"
    assert doc["hosts"][0]["peer_dsn"] == "host=a-peer dbname=app password=***"
    assert "admin_dsn" not in doc["hosts"][1] and "peer_dsn" not in doc["hosts"][1]
