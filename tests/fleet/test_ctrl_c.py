"""Ctrl-C during a fleet command: a real SIGINT to a real ``shardctl init`` process stops it at a shard
boundary, with a report of what was done and what was not, exit 130, every shard complete or absent,
and a re-run that finishes the job."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

from support.fleet import connect, load, run_cli
from support.process import process_env, shardctl_argv

SHARDS = 512
# Generous: the machine running the suite may be loaded. The stop itself is one batch away (one
# transaction of --batch-size shards).
STOP_WITHIN = 30.0


def recorded(topo) -> dict[str, set[int]]:
    out = {}
    for host in topo.hosts:
        with connect(topo, host.name, autocommit=True) as conn:
            if conn.execute("SELECT to_regclass('shardctl.shards')").fetchone()[0] is None:
                out[host.name] = set()
                continue
            out[host.name] = {r[0] for r in conn.execute("SELECT shard_id FROM shardctl.shards")}
    return out


def complete_or_absent(topo, latest: int) -> set[int]:
    """Every shard schema on every host is recorded with all ``latest`` migrations and its tables,
    and every recorded shard has its schema: returns the complete shards."""
    complete: set[int] = set()
    for host in topo.hosts:
        with connect(topo, host.name, autocommit=True) as conn:
            schemas = {
                int(r[0][5:])
                for r in conn.execute(
                    "SELECT nspname FROM pg_namespace WHERE nspname ~ '^insta[0-9]+$'"
                )
            }
            ledger = dict(
                conn.execute(
                    "SELECT s.shard_id, count(m.version) FROM shardctl.shards s "
                    "LEFT JOIN shardctl.migrations m USING (shard_id) GROUP BY 1"
                ).fetchall()
            )
            tables = dict(
                conn.execute(
                    "SELECT substr(n.nspname, 6)::int, count(*) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname ~ '^insta[0-9]+$' AND c.relkind = 'r' GROUP BY 1"
                ).fetchall()
            )
        assert schemas == set(ledger), (host.name, sorted(schemas ^ set(ledger))[:10])
        assert set(ledger.values()) <= {latest}, (host.name, set(ledger.values()))
        assert len(set(tables.values())) <= 1 and set(tables) == schemas, host.name
        complete |= schemas
    return complete


def test_ctrl_c_stops_init_at_a_shard_boundary_and_a_rerun_finishes(make_fleet):
    path = make_fleet(hosts=2, shards=SHARDS)
    topo = load(path)
    proc = subprocess.Popen(
        shardctl_argv("init", "--json", "--batch-size", "8", config=path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=process_env(),
    )
    try:
        deadline = time.monotonic() + 120
        while not any(recorded(topo).values()):  # mid-run: some shards made, not all
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        stopped_after = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert stopped_after < STOP_WITHIN, stopped_after
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    said = re.fullmatch(
        r"error: init: interrupted \(Ctrl-C\): stopped at a shard boundary; (\d+) shard\(s\) done, "
        r"(\d+) not started; every shard is complete or absent: run shardctl init again to finish",
        lines[0],
    )
    assert said, lines[0]
    done, not_started = int(said[1]), int(said[2])
    assert done + not_started == SHARDS and not_started > 0, lines[0]

    doc = json.loads(out)
    assert doc["command"] == "init" and doc["ok"] is False and doc["interrupted"] is True
    assert doc["exit_code"] == 130
    assert sum(h["created_count"] for h in doc["hosts"]) == done
    complete = complete_or_absent(topo, doc["latest_version"])
    assert len(complete) == done

    again = run_cli("init", "--json", config=path)
    assert again.exit_code == 0, again
    assert sum(h["created_count"] for h in json.loads(again.stdout)["hosts"]) == not_started
    assert len(complete_or_absent(topo, doc["latest_version"])) == SHARDS
    assert run_cli("verify", config=path).exit_code == 0
