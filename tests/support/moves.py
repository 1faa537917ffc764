"""Shard-move test support: fleets with rows (the ``fleet3`` fixture), where rows are, traffic during a move."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from shardctl.ops.move import (
    MoveOptions,
    move_shards,
)
from shardctl.router import Router

from .clients import RouterTraffic
from .fleet import connect, load
from .history import History


def init_fleet(make_fleet, shards: int = 48, hosts: int = 3) -> Path:
    """An initialised fleet (a copy of the template ``init`` built for its shape)."""
    return make_fleet(hosts=hosts, shards=shards, init=True)


def load_rows(topo, shards: list[int], per_shard: int) -> None:
    """``per_shard`` photos and a few users in each shard, straight into its host."""
    by_host: dict[str, list[int]] = {}
    for n in shards:
        by_host.setdefault(topo.host_of(n).name, []).append(n)
    for host, ns in by_host.items():
        with connect(topo, host, autocommit=True) as conn:
            conn.execute(
                "".join(
                    f"INSERT INTO insta{n}.photos (user_id, caption) SELECT g, 'photo ' || g "
                    f"FROM generate_series(1, {per_shard}) g;"
                    f"INSERT INTO insta{n}.users (username) SELECT 'user' || g FROM generate_series(1, 3) g;"
                    for n in ns
                )
            )


def ids_on(topo, host: str, shards: list[int], table: str = "photos") -> list[int]:
    with connect(topo, host) as conn:
        return [
            r[0]
            for r in conn.execute(
                " UNION ALL ".join(f"SELECT id FROM insta{n}.{table}" for n in shards)
            ).fetchall()
        ]


def replication_leftovers(topo) -> dict[str, list]:
    """Publications, subscriptions and slots of this fleet's databases on every host."""
    out = {}
    for h in topo.hosts:
        with connect(topo, h.name) as conn:
            out[h.name] = (
                conn.execute("SELECT pubname FROM pg_publication").fetchall()
                + conn.execute(
                    "SELECT subname FROM pg_subscription WHERE subdbid = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())"
                ).fetchall()
                + conn.execute(
                    "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()"
                ).fetchall()
            )
    return {k: v for k, v in out.items() if v}


def snapshot(topo, host: str, shards: list[int]) -> dict:
    """Everything a move could disturb on a host: schemas, rows, sequences, control rows, grants, triggers."""
    with connect(topo, host) as conn:
        doc = {
            "schemas": conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'insta%' ORDER BY 1"
            ).fetchall(),
            "shards": conn.execute(
                "SELECT shard_id, schema_name, state FROM shardctl.shards ORDER BY 1"
            ).fetchall(),
            "ledger": conn.execute(
                "SELECT shard_id, version, checksum, applied_at FROM shardctl.migrations "
                "ORDER BY 1, 2"
            ).fetchall(),
            "sequences": conn.execute(
                "SELECT schemaname, sequencename, last_value FROM pg_sequences "
                "WHERE schemaname LIKE 'insta%' ORDER BY 1, 2"
            ).fetchall(),
            "triggers": conn.execute(
                "SELECT tgrelid::regclass::text, tgname FROM pg_trigger "
                "WHERE NOT tgisinternal ORDER BY 1, 2"
            ).fetchall(),
            "acl": conn.execute(
                "SELECT c.oid::regclass::text, c.relacl::text FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname LIKE 'insta%' ORDER BY 1"
            ).fetchall(),
        }
        doc["rows"] = {
            n: conn.execute(
                f"SELECT count(*), sum(hashtext(p::text)) FROM insta{n}.photos p"
            ).fetchone()
            for n in shards
        }
    return doc


class Traffic(RouterTraffic):
    """Writers inserting into the moving shards through the router, and a reader reading them: the shared
    Router clients (support/clients.py), whose history :func:`check_moved` checks too. The reader scans
    the shard's table (``read="scan"``); tests/fleet/test_router_poolers.py reads by index."""

    def __init__(self, router: Router, shards: list[int], modulus: int, writers: int = 2):
        self.modulus = modulus
        keys = [
            shard + modulus * j for j in range(50) for shard in shards
        ]  # each routes to its shard
        super().__init__(
            History(router.topology.path), router, keys, writers, readers=1, read="scan"
        )

    def __enter__(self) -> Traffic:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def written(self) -> list[tuple[int, int, float, float]]:
        """id, shard, started, finished of every acknowledged write."""
        return [(w.id, w.key % self.modulus, w.start, w.end) for w in self.history.writes]

    @property
    def errors(self) -> list[str]:
        return [
            f"{f.op} of key {f.key} (shard {f.key % self.modulus}): {f.error}"
            for f in self.history.failures
        ]

    @property
    def reads(self) -> int:
        return len(self.history.reads)


@contextmanager
def router_traffic(
    path: Path, shards: list[int], warmup: float = 0.3, move_wait: float = 15
) -> Iterator[Traffic]:
    """:class:`Traffic` on ``shards`` through a Router of ``path`` for the block, started ``warmup`` s before it."""
    router = Router(load(path), move_wait=move_wait)
    try:
        with Traffic(router, shards, load(path).modulus) as traffic:
            time.sleep(warmup)
            yield traffic
    finally:
        router.close()


def move_under_traffic(
    path: Path, moved: list[int], source: str, target: str, options: MoveOptions | None = None
) -> tuple[dict, Traffic]:
    """Move ``moved`` from ``source`` to ``target`` while a Router writes to them, then :func:`check_moved`."""
    topo = load(path)
    before = ids_on(topo, source, moved)
    with router_traffic(path, moved) as traffic:
        report = move_shards(load(path), moved, target, options=options)
        time.sleep(0.5)
    assert report["phase"] == "cut_over" and report["verified"] is True, report
    check_moved(topo, path, moved, source, target, before, traffic, report)
    return report, traffic


def check_moved(
    topo_before,
    path: Path,
    moved: list[int],
    source: str,
    target: str,
    before_ids: list[int],
    traffic: Traffic,
    report: dict,
) -> None:
    """Every row written before, during and after the move is on the target exactly once."""
    topo = load(path)
    assert all(topo.host_of(n).name == target for n in moved)
    assert not traffic.errors, traffic.errors[:5]
    checked = traffic.history.check(
        path
    )  # each write once, in its shard; each read from its shard, not stale
    assert checked.ok, checked
    on_target = ids_on(topo, target, moved)
    assert len(on_target) == len(set(on_target))
    written = [w[0] for w in traffic.written]
    assert len(written) == len(set(written))
    assert sorted(on_target) == sorted(before_ids + written), "rows lost or duplicated"
    # The source's old schemas are renamed and refuse writes; under the old names only stubs remain
    # (views that tell direct clients where the shard went).
    with connect(topo_before, source, autocommit=True) as conn:
        live = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = ANY(%s) AND c.relkind <> 'v'",
            ([f"insta{n}" for n in moved],),
        ).fetchone()[0]
        assert live == 0
        renamed = f"insta{moved[0]}_moved_{report['move_id']}"
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"INSERT INTO {renamed}.photos (user_id) VALUES (1)")
        assert info.value.sqlstate == "SCM01"
        assert f"shard {moved[0]} moved to {target}" in str(info.value)
    # IDs minted after the cutover sort after every ID minted before it.
    start, end = report["freeze_started_at"], report["freeze_ended_at"]
    before = before_ids + [w[0] for w in traffic.written if w[3] < start]
    after = [w[0] for w in traffic.written if w[2] > end]
    assert before and after, (len(before), len(after))
    assert min(after) > max(before)


@pytest.fixture
def fleet3(make_fleet):
    """3 hosts, 48 shards (pg1 0-15, pg2 16-31, pg3 32-47), initialised, with rows."""
    path = init_fleet(make_fleet, shards=48)
    topo = load(path)
    load_rows(topo, list(range(48)), 150)
    return path
