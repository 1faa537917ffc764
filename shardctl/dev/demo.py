"""``demo``: a newcomer's tour — sandbox, init, writes through the router, decode, verify."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

from ..errors import OperationFailed
from ..model.topology import LayoutWarning, Topology
from ..ops.provision import init
from ..ops.verify import verify
from ..router import Router
from .sandbox import Sandbox

DEMO_USERS = [1, 2, 42, 1341, 31341, 77777]


def run_demo(
    directory: str,
    *,
    hosts: int | None = None,
    shards: int = 256,
    say: Callable[[str], None] = print,
) -> dict:
    """Run the tour and return what happened; ``say`` narrates each step. ``hosts``: servers (default
    2; a sandbox already in ``directory`` restarts its own)."""
    started = time.perf_counter()
    sandbox = Sandbox(directory)
    hosts = sandbox.host_count(hosts)
    say(f"1. Starting {hosts} PostgreSQL servers in {sandbox.dir} …")
    up = sandbox.up(hosts=hosts, shards=shards)
    for h in up["hosts"]:
        say(f"   {h['name']}: {h['dsn']}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LayoutWarning)
        topo = Topology.load(up["topology"])
    created = _init(topo, say)
    rows = _write(topo, say)
    decoded = _decode(topo, rows, say)
    checked = _verify(topo, say)
    return {
        "command": "demo",
        "ok": checked.ok,
        "dir": str(sandbox.dir),
        "topology": up["topology"],
        "hosts": up["hosts"],
        "created": created,
        "writes": rows,
        "decoded": decoded,
        "verify": checked.to_dict(),
        "seconds": round(time.perf_counter() - started, 3),
    }


def _init(topo: Topology, say: Callable[[str], None]) -> int:
    last = topo.schema_name(topo.shard_count - 1)
    say(
        f"2. init: {topo.shard_count} shards ({topo.schema_name(0)} … {last}) over {len(topo.hosts)} hosts …"
    )
    report = init(topo).raise_for_status()
    created = report.total("created")
    say(
        f"   created {created} shards in {report.seconds:.2f}s"
        if created
        else "   every shard already existed: nothing to do"
    )
    return created


def _write(topo: Topology, say: Callable[[str], None]) -> list[dict]:
    say(
        f"3. Writing a user and two photos per user through the router (shard = user_id % {topo.modulus}) …"
    )
    rows = []
    with Router(topo) as router:
        for user_id in DEMO_USERS:
            with router.connection(user_id) as conn:
                uid = conn.execute(
                    "INSERT INTO users (username) VALUES (%s) RETURNING id", (f"user{user_id}",)
                ).fetchone()[0]
                photo_ids = [
                    conn.execute(
                        "INSERT INTO photos (user_id, caption) VALUES (%s, %s) RETURNING id",
                        (user_id, f"photo {i} of user {user_id}"),
                    ).fetchone()[0]
                    for i in (1, 2)
                ]
            shard = router.shard_for(user_id)
            host = router.host_for(user_id).name
            schema = topo.schema_name(shard)
            rows.append(
                {
                    "user_id": user_id,
                    "shard": shard,
                    "schema": schema,
                    "host": host,
                    "row_id": uid,
                    "photo_ids": photo_ids,
                }
            )
            say(f"   user {user_id:>6} → shard {shard:>3} ({schema}) on {host}: user row id {uid}")
    return rows


def _decode(topo: Topology, rows: list[dict], say: Callable[[str], None]) -> list[dict]:
    say("4. Decoding the new IDs: each names the shard (and so the host) its row lives on …")
    decoded = []
    for r in rows:
        for pid in r["photo_ids"][:1]:
            d = topo.layout.decode(pid)
            host = topo.host_of(d["shard"]).name
            decoded.append(
                {
                    "id": pid,
                    "time": d["time"],
                    "shard": d["shard"],
                    "sequence": d["sequence"],
                    "host": host,
                    "matches_router": d["shard"] == r["shard"],
                }
            )
            say(
                f"   {pid} → {d['time']}, shard {d['shard']}, sequence {d['sequence']}, host {host}"
            )
    if not all(d["matches_router"] for d in decoded):
        raise OperationFailed("a decoded ID named a different shard than the router chose")
    return decoded


def _verify(topo: Topology, say: Callable[[str], None]) -> Any:
    say("5. verify: every shard's next_id(), IDs, clocks and placement …")
    checked = verify(topo, samples=8)
    say(
        f"   {'passed' if checked.ok else 'FAILED'}: {sum(h.value.shards_checked for h in checked.hosts)} shards, "
        f"{sum(h.value.ids_checked for h in checked.hosts)} IDs in {checked.seconds:.2f}s"
    )
    for v in checked.violations[:10]:
        say(f"   violation on {v.host} shard {v.shard}: {v.reason}")
    return checked
