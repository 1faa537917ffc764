"""Scenarios run in a subprocess (Django's settings are per process): ``python django_scenarios.py
NAME`` with SHARDCTL_CONFIG set; the example app (examples/django_app) is on sys.path. Each prints one
JSON line the fleet test checks (tests/fleet/test_django.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "examples" / "django_app"), str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gramsite.settings")

import django

django.setup()

from django.db import connections
from django.test import Client
from gram.models import Like, Photo, User

from shardctl.django import current, on_shard, router
from shardctl.django.middleware import ShardMiddleware


def crud() -> dict:
    """The app through its views: users, photos, likes; every photo got by its ID alone."""
    client = Client()
    users = []
    for i in range(12):
        uid = client.post(
            "/users", json.dumps({"username": f"user{i}"}), content_type="application/json"
        ).json()["id"]
        users.append((uid, f"user{i}"))
    photos, likes = [], []
    for n, (uid, _) in enumerate(users):
        for j in range(3):
            key = uid % 1000 + n  # photos keyed by a small user_id of their own
            pid = client.post(
                f"/users/{key}/photos",
                json.dumps({"caption": f"p{n}.{j}"}),
                content_type="application/json",
            ).json()["id"]
            photos.append((pid, key, f"p{n}.{j}"))
    for pid, _, _ in photos[::2]:
        for liker in (1, 2):
            client.post(
                f"/photos/{pid}/likes",
                json.dumps({"user_id": liker}),
                content_type="application/json",
            )
        likes += [(pid, 1), (pid, 2)]
    got = {pid: client.get(f"/photos/{pid}").json() for pid, _, _ in photos}
    listed = {key: client.get(f"/users/{key}/photos").json()["photos"] for _, key, _ in photos}
    like_rows = [
        (like.id, like.photo_id, like.user_id)
        for pid, _ in likes[::2]
        for like in Like.objects.filter(photo_id=pid)
    ]
    return {
        "users": users,
        "photos": photos,
        "got": got,
        "listed": listed,
        "likes": like_rows,
        "orm": orm_calls(photos),
    }


def orm_calls(photos: list) -> dict:
    """get/filter/save/delete/refresh_from_db by key or ID, and a save inside another shard's block."""
    pid, key, _ = photos[0]
    p = Photo.objects.get(pk=pid)
    other = next(k for _, k, _ in photos if router().shard_for(k) != router().shard_for(key))
    with on_shard(key=other):  # the object's own ID wins over the block
        p.caption = "edited in another shard's block"
        p.save()
        Photo.objects.filter(pk=pid).update(caption="updated by id")
        moved_in = Photo.objects.filter(
            caption="edited in another shard's block"
        ).count()  # the block's shard
    p.refresh_from_db()
    victim = Photo.objects.get(pk=photos[1][0])
    victim.delete()
    gone = not Photo.objects.filter(pk=photos[1][0]).exists()
    user = User.objects.get(username="user3")
    return {
        "caption": p.caption,
        "other_block_rows": moved_in,
        "deleted": photos[1][0],
        "gone": gone,
        "user3": user.id,
        "first_key": key,
        "other_key": other,
    }


def async_orm() -> dict:
    """Django's async ORM API from 32 tasks at once on one event loop (``acreate``, ``aget`` by ID,
    ``acount`` in an ``on_shard`` block, ``asave``), then the views through Django's ASGI handler
    (``AsyncClient``, the middleware's async path). asgiref copies each task's context into the thread
    that runs its queries, so every task sees its own shard and none another's."""
    import asyncio

    from asgiref.sync import sync_to_async
    from django.test import AsyncClient

    async def task(n: int) -> dict:
        key = 5000 + n
        photo = await Photo.objects.acreate(user_id=key, caption=f"async {n}")
        got = await Photo.objects.aget(pk=photo.id)
        with on_shard(key=key):
            await asyncio.sleep(
                0.01 * (n % 3)
            )  # the other tasks run meanwhile, each on its own shard
            schema = await sync_to_async(_schema)()
            count = await Photo.objects.filter(user_id=key).acount()
        got.caption = f"async {n} edited"
        await got.asave()
        return {"id": photo.id, "key": key, "schema": schema, "count": count}

    async def through_asgi() -> list:
        client = AsyncClient()
        out = []
        for n in range(4):
            key = 6000 + n
            made = await client.post(
                f"/users/{key}/photos",
                json.dumps({"caption": f"asgi {n}"}),
                content_type="application/json",
            )
            pid = made.json()["id"]
            out.append({"id": pid, "key": key, "got": (await client.get(f"/photos/{pid}")).json()})
        return out

    async def main() -> tuple[list, list]:
        return list(await asyncio.gather(*(task(n) for n in range(32)))), await through_asgi()

    tasks, asgi = asyncio.run(main())
    return {
        "tasks": tasks,
        "asgi": asgi,
        "expected": {
            str(t["key"]): router().topology.schema_name(router().shard_for(t["key"]))
            for t in tasks + asgi
        },
    }


def session_path(alias: str) -> str:
    """The session's search_path on a Django connection, outside any transaction."""
    with connections[alias].cursor() as cur:
        cur.execute("SELECT current_setting('search_path')")
        return cur.fetchone()[0]


def leaks() -> dict:
    """16 threads: nested on_shard blocks and requests that follow each other; every statement checks
    which schema answered, and the middleware resets a shard a view leaked."""
    keys = list(range(1, 200))
    errors: list[str] = []
    counts = {"blocks": 0, "requests": 0}
    lock = threading.Lock()

    def _schema() -> str:
        here = current()
        with connections[here.alias].cursor() as cur:
            cur.execute("SELECT current_schema()")
            return cur.fetchone()[0]

    def worker(n: int) -> None:
        rng = random.Random(n)
        client = Client()
        leaky = ShardMiddleware(
            lambda request: on_shard(key=rng.choice(keys)).__enter__() and 1 / 0
        )
        try:
            for _ in range(40):
                a, b = rng.sample(keys, 2)
                sa, sb = router().schema_for(a), router().schema_for(b)
                with on_shard(key=a):
                    got_a = _schema()
                    with on_shard(key=b):
                        got_b = _schema()
                        pid = Photo.objects.create(user_id=b, caption="leak").id
                    back_a = _schema()
                if (got_a, got_b, back_a) != (sa, sb, sa) or current() is not None:
                    errors.append(
                        f"nested: {(got_a, got_b, back_a)} != {(sa, sb, sa)}, after: {current()}"
                    )
                if router().shard_of_id(pid) != router().shard_for(b):
                    errors.append(
                        f"photo {pid} of key {b} minted on shard {router().shard_of_id(pid)}"
                    )
                try:
                    leaky(None)
                except ZeroDivisionError:
                    pass
                if current() is not None:
                    errors.append(f"the middleware let {current()} leak")
                got = client.get(f"/photos/{pid}").json()
                if got.get("user_id") != b:
                    errors.append(f"GET /photos/{pid}: {got}")
                for alias in connections.settings:
                    if alias != "default" and "insta" in session_path(alias):
                        errors.append(f"{alias}: session search_path {session_path(alias)}")
                with lock:
                    counts["blocks"] += 2
                    counts["requests"] += 1
        except Exception as exc:  # noqa: BLE001
            errors.append(f"thread {n}: {type(exc).__name__}: {exc}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"errors": errors[:20], "error_count": len(errors), **counts}


def atomic() -> dict:
    """transaction.atomic on one host spanning two of its shards, a rollback, and a savepoint: each
    statement answers from its block's shard; nothing stays in the session afterwards."""
    from django.db import transaction

    r = router()
    host_of = {n: r.placement.locate(n).name for n in range(r.topology.shard_count)}
    a = next(k for k in range(1, 100) if host_of[r.shard_for(k)] == "pg1")
    b = next(
        k
        for k in range(1, 100)
        if host_of[r.shard_for(k)] == "pg1" and r.shard_for(k) != r.shard_for(a)
    )
    seen, ids = [], []
    with on_shard(key=a) as where, transaction.atomic(using=where.alias):
        seen.append(_schema())
        ids.append(Photo.objects.create(user_id=a, caption="atomic a").id)
        with on_shard(key=b):
            seen.append(_schema())
            ids.append(Photo.objects.create(user_id=b, caption="atomic b").id)
            with transaction.atomic(using=where.alias):  # a savepoint
                ids.append(Photo.objects.create(user_id=b, caption="atomic b2").id)
        seen.append(_schema())
    try:
        with on_shard(key=a) as where, transaction.atomic(using=where.alias):
            rolled = Photo.objects.create(user_id=a, caption="rolled back").id
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    return {
        "a": a,
        "b": b,
        "seen": seen,
        "ids": ids,
        "rolled": rolled,
        "schemas": [r.schema_for(a), r.schema_for(b), r.schema_for(a)],
        "session": session_path("pg1"),
        "rolled_found": Photo.objects.filter(pk=rolled).exists(),
    }


def _schema() -> str:
    here = current()
    with connections[here.alias].cursor() as cur:
        cur.execute("SELECT current_schema()")
        return cur.fetchone()[0]


def move() -> dict:
    """ORM writers (6) and readers (2) on the moving shards 4-7 and on two that stay, while they move
    pg1 -> pg2; the history is checked against every shard afterwards (support/history.py)."""
    from shardctl.model.topology import Topology
    from shardctl.ops.move import move_shards

    path = Path(os.environ["SHARDCTL_CONFIG"])
    moved = [4, 5, 6, 7]

    def operation() -> dict:
        report = move_shards(Topology.load(path), moved, "pg2")
        return {"phase": report["phase"], "verified": report["verified"]}

    return _traffic_during(operation, moved + [0, 9], keys_per_shard=4)


def migrate() -> dict:
    """ORM writers (6) and readers (2) on every shard while ``shardctl migrate`` (the CLI, as CI runs it)
    applies the fleet's pending migrations; the history is checked against every shard afterwards."""
    path = Path(os.environ["SHARDCTL_CONFIG"])

    def operation() -> dict:
        cli = [sys.executable, "-m", "shardctl", "--config", str(path), "migrate"]
        done = subprocess.run(cli, capture_output=True, text=True, timeout=300, check=False)
        return {"exit_code": done.returncode, "output": (done.stdout + done.stderr)[-2000:]}

    return _traffic_during(operation, list(range(16)), keys_per_shard=2)


def _traffic_during(operation, shards: list[int], keys_per_shard: int) -> dict:
    """``operation()`` while 6 ORM writers and 2 readers work on keys of ``shards``: its result, with the
    history checker's verdict."""
    from django.contrib.postgres.aggregates import ArrayAgg
    from django.db.models import Max, TextField
    from django.db.models.expressions import RawSQL

    from shardctl.model.topology import Topology
    from support.clients import keys_for
    from support.history import History, now

    path = Path(os.environ["SHARDCTL_CONFIG"])
    keys = keys_for(Topology.load(path), shards, keys_per_shard)
    history = History(path, table="gram_photos")
    halt = threading.Event()
    schema_sql = Max(RawSQL("current_schema()", (), output_field=TextField()))

    def write(client: str) -> None:
        rng, caption = random.Random(client), history.caption(client)
        while not halt.is_set():
            key, start = rng.choice(keys), now()
            try:
                photo = Photo.objects.create(user_id=key, caption=caption)
            except Exception as exc:  # noqa: BLE001 - every error the application sees is recorded
                history.failed(client, "write", key, exc, start, now())
                continue
            history.acked(client, key, photo.id, start, now())
            time.sleep(0.01)  # hundreds of statements a second, not thousands (support.clients)
        connections.close_all()

    def read(client: str) -> None:
        rng = random.Random(client)
        while not halt.is_set():
            key, start = rng.choice(keys), now()
            try:
                got = Photo.objects.filter(user_id=key).aggregate(
                    ids=ArrayAgg("id"), schema=schema_sql
                )
            except Exception as exc:  # noqa: BLE001
                history.failed(client, "read", key, exc, start, now())
                continue
            if got["schema"] is not None:
                history.read(client, key, got["schema"], got["ids"], start, now())
            time.sleep(0.01)  # hundreds of statements a second, not thousands (support.clients)
        connections.close_all()

    threads = [threading.Thread(target=write, args=(f"w{i}",)) for i in range(6)]
    threads += [threading.Thread(target=read, args=(f"r{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    try:
        done = operation()
        time.sleep(0.3)
    finally:
        halt.set()
        for t in threads:
            t.join()
    checked = history.check()
    return {
        **done,
        "ok": checked.ok,
        "report": str(checked),
        "counts": checked.counts,
        "redirects": router().redirects(),
    }


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]]()))
