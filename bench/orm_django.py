#!/usr/bin/env python
"""Cost of shardctl.django per request, against plain Django on a single plain database.

A request is one insert and one get by ID: ``Photo.objects.create(user_id=k, caption=...)`` then
``Photo.objects.get(pk=id)``. Candidates (same process, same server, Django's psycopg 3 backend,
persistent connections, ``--requests`` requests per round):

* ``plain Django``        the baseline: the same model with a plain BigAutoField (an identity column)
  in a plain database, Django's own postgresql backend, no router;
* ``shardctl.django``     the example app's ``Photo`` (examples/django_app): routed by its shard key
  on the create and by the decoded ID on the get, each statement on its shard through the shardctl
  backend (``SET LOCAL search_path`` in the statement's round trip), ids from the shard's ``next_id()``;
  keys routing to shard 5, as in bench/router.py, so that it writes one table like the baselines;
* ``shardctl.django in on_shard``  the same inside ``on_shard(key=k)`` blocks (informational);
* ``plain Django, next_id() ids``  the baseline with its ids from a shard's ``next_id()`` (plpgsql) as the
  sharded table's are (informational: what the ID function costs, apart from the routing);
* ``shardctl.django, keys over 64 shards``  keys spread over every shard (informational: 64 tables and
  their indexes in each server process's caches instead of one, the fleet's own cost).

Within a round the candidates take turns every ``--chunk`` requests (order rotated); the figure is the
median over rounds of the per-round time ratio to the baseline. Target: ``shardctl.django`` <= 1.20x.

Importable: ``run(topology_path, plain_dsn, requests, chunk, rounds)`` returns the series (for
bench/orm.py); standalone it starts a 1-server sandbox fleet of 64 shards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "examples" / "django_app")]

import _common as c

TARGET = 1.20
SHARDS = 64
KEYS: list[
    int
] = []  # 256 owners' IDs on shard 5, as bench/router.py: the same table as the baselines
SPREAD: list[int] = []  # 256 owners' IDs over all 64 shards (a photo lives on its owner's shard)


def owner_ids(layout, shards: list[int]) -> list[int]:
    """An owner's ID (as next_id() would mint it) on each of ``shards`` in turn: Photo's shard key is
    its owner's ID (``shard_key_is_id``)."""
    return [layout.encode(shard=n) + j for j, n in enumerate(shards)]


NAMES = (
    "plain Django",
    "shardctl.django",
    "shardctl.django in on_shard",
    "plain Django, next_id() ids",
    "shardctl.django, keys over 64 shards",
)


def setup_django(topology: Path, plain_dsn: str) -> tuple[type, type, type]:
    """Django configured in this process: the example app on ``topology``, and ``default`` (the plain
    database) holding the baselines' tables. Returns (Photo, PlainPhoto, IdPhoto)."""
    import django
    import psycopg
    from django.conf import settings

    import shardctl.django as sd

    parts = psycopg.conninfo.conninfo_to_dict(plain_dsn)
    plain = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts["dbname"],
        "USER": parts.get("user", ""),
        "HOST": parts.get("host", ""),
        "PORT": parts.get("port", ""),
        "CONN_MAX_AGE": 60,
    }
    settings.configure(
        DATABASES=sd.databases(topology, default=plain),
        USE_TZ=True,
        DATABASE_ROUTERS=["shardctl.django.DatabaseRouter"],
        INSTALLED_APPS=["django.contrib.contenttypes", "shardctl.django", "gram"],
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    from django.core.management import call_command
    from django.db import connections, models
    from gram.models import Photo

    from shardctl.django.models import ShardIdField

    class PlainPhoto(models.Model):
        user_id = models.BigIntegerField()
        caption = models.TextField(blank=True)
        created_at = models.DateTimeField(auto_now_add=True)

        class Meta:  # the same table as the example's Photo (its index too), ids from an identity column
            app_label = "gram"
            db_table = "plain_photos"
            indexes = [models.Index(fields=["user_id", "-id"], name="plain_photos_user")]

    with open(os.devnull, "w") as devnull:
        call_command("shardctl_makemigrations", "gram", verbosity=0, stdout=devnull)
    migrate = subprocess.run(
        [sys.executable, "-m", "shardctl", "--config", str(topology), "migrate"],
        capture_output=True,
        text=True,
        check=False,
    )
    if migrate.returncode != 0:
        raise SystemExit(f"shardctl migrate failed: {migrate.stdout}{migrate.stderr}")

    class IdPhoto(models.Model):
        id = ShardIdField(primary_key=True)
        user_id = models.BigIntegerField()
        caption = models.TextField(blank=True)
        created_at = models.DateTimeField(auto_now_add=True)

        class Meta:
            app_label = "gram"
            db_table = "plain_id_photos"
            indexes = [models.Index(fields=["user_id", "-id"], name="plain_id_photos_user")]

    from shardctl.model.topology import Topology
    from shardctl.sql.render import render_shard

    with connections[
        "default"
    ].cursor() as cur:  # shard 5's schema and next_id() in the plain database
        cur.execute(render_shard(Topology.load(topology), 5))
        cur.execute(
            "SET search_path = public, insta5"
        )  # tables in public, next_id() found in insta5
    with connections["default"].schema_editor() as editor:
        editor.create_model(PlainPhoto)
        editor.create_model(
            IdPhoto
        )  # id bigint DEFAULT next_id(): insta5.next_id, bound at creation
    connections["default"].close()  # the session's search_path goes with it
    return Photo, PlainPhoto, IdPhoto


def candidates(Photo: type, PlainPhoto: type, IdPhoto: type) -> dict:
    from shardctl.django import on_shard, router

    layout = router().topology.layout
    KEYS[:] = owner_ids(layout, [5] * 256)
    SPREAD[:] = owner_ids(layout, [n % SHARDS for n in range(256)])

    def plain(i: int) -> None:
        key = KEYS[i % len(KEYS)]
        p = PlainPhoto.objects.create(user_id=key, caption=f"c{i}")
        PlainPhoto.objects.get(pk=p.pk)

    def routed(i: int) -> None:
        key = KEYS[i % len(KEYS)]
        p = Photo.objects.create(user_id=key, caption=f"c{i}")
        Photo.objects.get(pk=p.pk)

    def blocks(i: int) -> None:
        key = KEYS[i % len(KEYS)]
        with on_shard(id=key):
            p = Photo.objects.create(user_id=key, caption=f"c{i}")
            Photo.objects.get(pk=p.pk)

    def plain_ids(i: int) -> None:
        key = KEYS[i % len(KEYS)]
        p = IdPhoto.objects.create(user_id=key, caption=f"c{i}")
        IdPhoto.objects.get(pk=p.pk)

    def spread(i: int) -> None:
        key = SPREAD[i % len(SPREAD)]
        p = Photo.objects.create(user_id=key, caption=f"c{i}")
        Photo.objects.get(pk=p.pk)

    return dict(zip(NAMES, (plain, routed, blocks, plain_ids, spread)))


def run(
    topology: Path, plain_dsn: str, requests: int, chunk: int, rounds: int
) -> dict[str, c.Series]:
    work = candidates(*setup_django(topology, plain_dsn))
    for fn in work.values():  # warm-up: connections, caches
        for i in range(50):
            fn(i)
    series = {name: c.Series(name, work=requests) for name in work}
    for r in range(rounds):
        seconds = dict.fromkeys(work, 0.0)
        for n, start in enumerate(range(0, requests, chunk)):
            for name in c.rotated(list(work), r + n):
                fn = work[name]
                began = time.perf_counter()
                for i in range(start, min(start + chunk, requests)):
                    fn(i)
                seconds[name] += time.perf_counter() - began
        for name, s in seconds.items():
            series[name].add(s)
            c.log(f"round {r + 1}/{rounds} {name}: {s / requests * 1e6:.0f} µs/request")
    return series


def main() -> int:
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--requests",
        type=int,
        default=4000,
        help="Requests (insert + get) per candidate and round.",
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=200,
        help="Requests per turn: candidates take turns within a round.",
    )
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or (3 if args.quick else 5))
    requests = 1000 if args.quick and args.requests == 4000 else args.requests
    with c.sandbox(
        hosts=1,
        shards=SHARDS,
        keep=args.keep,
        prefix="shardctl-bench-django-",
        base=c.sandbox_base(args.tmp, need_gb=1),
    ) as box:
        init = subprocess.run(
            [sys.executable, "-m", "shardctl", "--config", str(box.topology_path), "init"],
            capture_output=True,
            text=True,
            check=False,
        )
        if init.returncode != 0:
            raise SystemExit(f"shardctl init failed: {init.stdout}{init.stderr}")
        port = c.load_topology(box.topology_path).hosts[0]
        import psycopg

        dsn = port.dsn_for("admin")
        srv = psycopg.conninfo.conninfo_to_dict(dsn)
        [plain_db] = c.create_databases([int(srv["port"])], "django_plain")
        series = run(
            box.topology_path, c.admin_dsn(int(srv["port"]), plain_db), requests, args.chunk, rounds
        )
        from django.db import connections

        connections.close_all()
    base = series[NAMES[0]]
    table = []
    for name, s in series.items():
        ratio = s.ratio_to(base, faster_is_higher=False)
        target, ok = (
            (f"<= {TARGET:.2f}x baseline time", ratio <= TARGET) if name == NAMES[1] else ("", None)
        )
        table.append(
            c.Row(
                name,
                f"{s.median_s / requests * 1e6:.0f} µs/request",
                f"{min(s.seconds) / requests * 1e6:.0f} – {max(s.seconds) / requests * 1e6:.0f} µs",
                None if s is base else ratio,
                target,
                ok,
                ratio_range=None
                if s is base
                else c.ratio_range(s.ratios_to(base, faster_is_higher=False)),
            )
        )
    import django

    notes = [
        (
            f"{requests} requests (insert + get by ID) per candidate and round (turns of {args.chunk}), "
            f"{rounds} rounds, {len(KEYS)} owners on shard 5 (spread: {len(SPREAD)} owners over "
            f"{SHARDS} shards), Django {django.__version__}"
        ),
        c.machine_note(),
    ]
    c.print_table(
        "shardctl.django per request vs plain Django (time; lower is better)",
        table,
        NAMES[0],
        notes,
    )
    c.save_run(
        args,
        {
            "requests": requests,
            "rounds": rounds,
            "seconds": {k: v.seconds for k, v in series.items()},
        },
    )
    return c.verdict_exit([table])


if __name__ == "__main__":
    sys.exit(main())
