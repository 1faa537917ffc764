#!/usr/bin/env python
"""Cost of an ORM integration per request, against the same ORM on a single plain database.

A request inserts one photo (its id from the shard's next_id(), RETURNING) in one session and gets it by
its ID in another: what a web request of the example apps does. Per ORM, two candidates:

* the baseline: the plain ORM (SQLAlchemy: one Engine, its QueuePool, a plain Session) on one database
  whose tables are one shard's (the same rows, indexes and next_id() on the server: only the client
  side differs), ``search_path`` set once per connection;
* the integration: the ORM through shardctl (``shardctl.sqlalchemy.sessionmaker(router)``; for
  ``sqlalchemy-asyncio``, ``shardctl.sqlalchemy.asyncio.async_sessionmaker(async_router)`` against
  SQLAlchemy's own ``AsyncSession``; for ``django``, the example app's models through ``shardctl.django``
  against plain Django), each request's user_id routing it to one of the fleet's 64 shards, its get
  routed by the shard inside the ID.

ORMs are listed in ``ORMS`` (name → a function returning its two candidates); ``--orm`` picks them.
Both candidates do the same requests (the same owners, captions and request numbers). Each first warms
up on every shard (its connections, compiled caches, and each of the 64 tables in the server's caches:
the baseline's one table is warm after a few requests). Then they take turns every ``--chunk`` requests
(the order rotating), over ``--rounds`` rounds: short turns, so that both see the same load on a shared
machine; the figure is the median over rounds of the per-round ratio of the integration's time to its
baseline's.

Target: the integration <= 1.2x its baseline's time.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(
    1, str(Path(__file__).resolve().parents[1])
)  # this checkout's shardctl, not another install's

import _common as c

SHARDS = 64
BASE_SCHEMA = "insta5"
TARGET = 1.2
WARM_UP = 4 * SHARDS  # requests per candidate before the rounds: every shard's table, several times
APPS = c.REPO / "examples"


class Candidate:
    """``request(i)`` does one request; ``close()`` frees what it holds."""

    def __init__(self, name: str, request: Callable[[int], None], close: Callable[[], None]):
        self.name, self.request, self.close = name, request, close

    def chunk(self, start: int, count: int) -> float:
        request = self.request
        started = time.perf_counter()
        for i in range(start, start + count):
            request(i)
        return time.perf_counter() - started


def owner(topo, i: int) -> int:
    """Request ``i``'s user ID: the example places a photo on its owner's shard (the shard inside
    ``user_id``), so consecutive requests go to the fleet's shards in turn."""
    return topo.layout.encode(shard=i % SHARDS, time=i)


def sqlalchemy_candidates(topo) -> list[Candidate]:
    """Plain SQLAlchemy on one shard's tables, and SQLAlchemy through shardctl.sqlalchemy."""
    sys.path.insert(0, str(APPS / "sqlalchemy_app"))
    import psycopg
    import sqlalchemy
    from models import Photo
    from sqlalchemy.orm import sessionmaker as plain_sessionmaker

    from shardctl.router import Router
    from shardctl.sqlalchemy import sessionmaker

    def requests(Session) -> Callable[[int], None]:
        def request(i: int) -> None:
            with Session() as session:
                photo = Photo(user_id=owner(topo, i), caption=f"photo {i}")
                session.add(photo)
                session.commit()
                photo_id = photo.id
            with Session() as session:
                assert session.get(Photo, photo_id).caption == f"photo {i}"

        return request

    host = topo.host_of(5)
    kwargs = host.connect_kwargs()
    engine = sqlalchemy.create_engine(
        "postgresql+psycopg://",
        pool_size=2,
        creator=lambda: psycopg.connect(**kwargs, options=f"-c search_path={BASE_SCHEMA},public"),
    )
    router = Router(topo)
    return [
        Candidate(
            "SQLAlchemy, one database",
            requests(plain_sessionmaker(engine, expire_on_commit=False)),
            engine.dispose,
        ),
        Candidate(
            "shardctl.sqlalchemy",
            requests(sessionmaker(router, expire_on_commit=False)),
            router.close,
        ),
    ]


def sqlalchemy_asyncio_candidates(topo) -> list[Candidate]:
    """Plain SQLAlchemy asyncio (``AsyncSession``, ``postgresql+psycopg_async``) on one shard's tables, and
    ``shardctl.sqlalchemy.asyncio`` over an AsyncRouter; both on one event loop, driven a request at a time."""
    import asyncio

    sys.path.insert(0, str(APPS / "sqlalchemy_app"))
    import psycopg
    from models import Photo
    from sqlalchemy.ext.asyncio import async_sessionmaker as plain_sessionmaker
    from sqlalchemy.ext.asyncio import create_async_engine

    from shardctl.router import AsyncRouter
    from shardctl.sqlalchemy.asyncio import async_sessionmaker

    loop = asyncio.new_event_loop()

    def requests(Session) -> Callable[[int], None]:
        async def request(i: int) -> None:
            async with Session() as session:
                photo = Photo(user_id=owner(topo, i), caption=f"photo {i}")
                session.add(photo)
                await session.commit()
                photo_id = photo.id
            async with Session() as session:
                assert (await session.get(Photo, photo_id)).caption == f"photo {i}"

        return lambda i: loop.run_until_complete(request(i))

    kwargs = topo.host_of(5).connect_kwargs()
    engine = create_async_engine(
        "postgresql+psycopg_async://",
        pool_size=2,
        async_creator=lambda: psycopg.AsyncConnection.connect(
            **kwargs, options=f"-c search_path={BASE_SCHEMA},public"
        ),
    )
    router = AsyncRouter(topo)

    def close() -> None:
        loop.run_until_complete(engine.dispose())
        loop.run_until_complete(router.close())

    return [
        Candidate(
            "SQLAlchemy asyncio, one database",
            requests(plain_sessionmaker(engine, expire_on_commit=False)),
            lambda: None,
        ),
        Candidate(
            "shardctl.sqlalchemy.asyncio",
            requests(async_sessionmaker(router, expire_on_commit=False)),
            close,
        ),
    ]


def django_candidates(topo) -> list[Candidate]:
    """Plain Django (its own postgresql backend, persistent connections, ``search_path`` set per
    connection) on one shard's tables, and the example app (examples/django_app) through
    shardctl.django: each request's photo on its owner's shard, owners spread over the 64 shards, its
    get routed by the shard inside the ID."""
    sys.path.insert(0, str(APPS / "django_app"))
    import django
    import psycopg
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections, models

    import shardctl.django as sd

    parts = psycopg.conninfo.conninfo_to_dict(topo.host_of(5).dsn_for("admin"))
    plain = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts["dbname"],
        "USER": parts.get("user", ""),
        "HOST": parts.get("host", ""),
        "PORT": parts.get("port", ""),
        "CONN_MAX_AGE": 60,
        "OPTIONS": {"options": f"-c search_path={BASE_SCHEMA},public"},
    }
    settings.configure(
        DATABASES=sd.databases(topo.path, default=plain),
        USE_TZ=True,
        DATABASE_ROUTERS=["shardctl.django.DatabaseRouter"],
        INSTALLED_APPS=["django.contrib.contenttypes", "shardctl.django", "gram"],
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    from gram.models import Photo

    call_command("shardctl_makemigrations", "gram", verbosity=0)
    cli = [sys.executable, "-m", "shardctl", "--config", str(topo.path), "migrate"]
    migrated = subprocess.run(cli, capture_output=True, text=True, check=False)
    if migrated.returncode != 0:
        raise SystemExit(f"shardctl migrate failed: {migrated.stdout}{migrated.stderr}")

    class OneDatabasePhoto(models.Model):  # the example's table in one shard's schema, as is
        id = models.BigAutoField(primary_key=True)  # DEFAULT next_id(), RETURNING id
        user_id = models.BigIntegerField()
        caption = models.TextField(blank=True)
        created_at = models.DateTimeField(auto_now_add=True)

        class Meta:
            app_label = "gram"
            db_table = "gram_photos"
            managed = False

    owners = [topo.layout.encode(shard=n % SHARDS) + n for n in range(256)]

    def requests(model: type) -> Callable[[int], None]:
        def request(i: int) -> None:
            photo = model.objects.create(user_id=owners[i % 256], caption=f"photo {i}")
            assert model.objects.get(pk=photo.pk).caption == f"photo {i}"

        return request

    return [
        Candidate("Django, one database", requests(OneDatabasePhoto), lambda: None),
        Candidate("shardctl.django", requests(Photo), connections.close_all),
    ]


ORMS: dict[str, Callable[[object], list[Candidate]]] = {
    "sqlalchemy": sqlalchemy_candidates,
    "sqlalchemy-asyncio": sqlalchemy_asyncio_candidates,
    "django": django_candidates,
}


def one_round(
    candidates: list[Candidate], requests: int, chunk: int, round_no: int, offset: int
) -> dict[str, float]:
    seconds = dict.fromkeys((cand.name for cand in candidates), 0.0)
    by_name = {cand.name: cand for cand in candidates}
    for n, start in enumerate(range(0, requests, chunk)):
        for name in c.rotated(list(by_name), round_no + n):
            seconds[name] += by_name[name].chunk(offset + start, min(chunk, requests - start))
    return seconds


def main() -> int:
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2_000, help="Requests per candidate and round.")
    p.add_argument(
        "--chunk",
        type=int,
        default=20,
        help="Requests per turn: candidates take turns within a round (tens of ms, so that load "
        "that comes and goes falls on both).",
    )
    p.add_argument("--orm", default=",".join(ORMS), help=f"ORMs to measure (of {', '.join(ORMS)}).")
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or (3 if args.quick else 7))
    requests = 500 if args.quick and args.requests == 2_000 else args.requests
    orms = [name.strip() for name in args.orm.split(",") if name.strip()]
    unknown = [name for name in orms if name not in ORMS]
    if unknown:
        raise SystemExit(f"unknown ORM(s): {', '.join(unknown)} (known: {', '.join(ORMS)})")

    with c.sandbox(
        hosts=1,
        shards=SHARDS,
        keep=args.keep,
        prefix="shardctl-bench-orm-",
        base=c.sandbox_base(args.tmp, need_gb=1),
    ) as box:
        init = subprocess.run(
            [sys.executable, "-m", "shardctl", "--config", str(box.topology_path), "init"],
            check=False,
            capture_output=True,
            text=True,
        )
        if init.returncode != 0:
            raise SystemExit(f"shardctl init failed: {init.stdout}{init.stderr}")
        topo = c.load_topology(box.topology_path)
        tables = []
        figures: dict = {
            "requests": requests,
            "rounds": rounds,
            "chunk": args.chunk,
            "shards": SHARDS,
            "warm_up": WARM_UP,
        }
        for orm in orms:
            candidates = ORMS[orm](topo)
            try:
                for cand in candidates:  # warm-up: connections, compiled caches, every shard
                    cand.chunk(10_000_000, WARM_UP)
                series = {cand.name: c.Series(cand.name, work=requests) for cand in candidates}
                for r in range(rounds):
                    for name, seconds in one_round(
                        candidates, requests, args.chunk, r, r * requests
                    ).items():
                        series[name].add(seconds)
                        c.log(
                            f"{orm} round {r + 1}/{rounds} {name}: {seconds / requests * 1e6:.0f} µs/request"
                        )
            finally:
                for cand in candidates:
                    cand.close()
            table = table_of(orm, series, candidates[0].name, requests, rounds, args.chunk)
            tables.append(table)
            figures[orm] = figures_of(series, table, requests)
    c.save_run(args, figures)
    return c.verdict_exit(tables)


def figures_of(series: dict[str, c.Series], table: list[c.Row], requests: int) -> dict:
    """One ORM's figures as the table prints them: both candidates' medians in µs per request, the
    integration's ratio to its baseline (median of the per-round ratios) with their range, the target
    and the verdict; and every round's µs per request."""
    (base_name, base), (name, s) = list(series.items())[:2]
    row = table[1]

    def us(seconds: float) -> int:
        return round(seconds / requests * 1e6)

    return {
        "baseline": base_name,
        "baseline_us": us(base.median_s),
        "candidate": name,
        "us": us(s.median_s),
        "ratio": round(row.ratio, 3),
        "range": [round(v, 3) for v in row.ratio_range] if row.ratio_range else None,
        "target": TARGET,
        "verdict": row.verdict,
        "us_per_round": {k: [us(t) for t in v.seconds] for k, v in series.items()},
    }


def table_of(
    orm: str, series: dict[str, c.Series], base_name: str, requests: int, rounds: int, chunk: int
) -> list[c.Row]:
    base = series[base_name]
    table = []
    for name, s in series.items():
        ratio = None if s is base else s.ratio_to(base, faster_is_higher=False)
        target, ok = (
            ("", None) if s is base else (f"<= {TARGET:.2f}x baseline time", ratio <= TARGET)
        )
        table.append(
            c.Row(
                name,
                f"{s.median_s / requests * 1e6:.0f} µs/request",
                f"{min(s.seconds) / requests * 1e6:.0f} – {max(s.seconds) / requests * 1e6:.0f} µs",
                ratio,
                target,
                ok,
                ratio_range=None
                if s is base
                else c.ratio_range(s.ratios_to(base, faster_is_higher=False)),
            )
        )
    notes = [
        (
            f"{requests} requests (insert + commit, then get by ID in a new session) per candidate and "
            f"round, turns of {chunk}, {rounds} rounds; {SHARDS} shards on one host; baseline tables: "
            f"{BASE_SCHEMA}"
        ),
        c.machine_note(),
    ]
    c.print_table(f"{orm}: cost per request (time; lower is better)", table, base_name, notes)
    return table


if __name__ == "__main__":
    sys.exit(main())
