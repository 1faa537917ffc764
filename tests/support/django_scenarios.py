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
from contextlib import contextmanager
from pathlib import Path

import psycopg

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
            key = uid  # on its owner's shard
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
    other = next(k for _, k, _ in photos if router().shard_of_id(k) != router().shard_of_id(key))
    with on_shard(id=other):  # the object's own ID wins over the block
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
        key = key_on(n % router().topology.shard_count, 50 + n)
        photo = await Photo.objects.acreate(user_id=key, caption=f"async {n}")
        got = await Photo.objects.aget(pk=photo.id)
        with on_shard(id=key):
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
            key = key_on(n, 100 + n)
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
            str(t["key"]): router().topology.schema_name(router().shard_of_id(t["key"]))
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
    keys = [key_on(n % router().topology.shard_count, n) for n in range(1, 200)]
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
        leaky = ShardMiddleware(lambda request: on_shard(id=rng.choice(keys)).__enter__() and 1 / 0)
        try:
            for _ in range(40):
                a, b = rng.sample(keys, 2)
                sa, sb = schema_of(a), schema_of(b)
                with on_shard(id=a):
                    got_a = _schema()
                    with on_shard(id=b):
                        got_b = _schema()
                        pid = Photo.objects.create(user_id=b, caption="leak").id
                    back_a = _schema()
                if (got_a, got_b, back_a) != (sa, sb, sa) or current() is not None:
                    errors.append(
                        f"nested: {(got_a, got_b, back_a)} != {(sa, sb, sa)}, after: {current()}"
                    )
                if router().shard_of_id(pid) != router().shard_of_id(b):
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
    first, second = [n for n in sorted(host_of) if host_of[n] == "pg1"][:2]
    a, b = key_on(first, 7), key_on(second, 7)
    seen, ids = [], []
    with on_shard(id=a) as where, transaction.atomic(using=where.alias):
        seen.append(_schema())
        ids.append(Photo.objects.create(user_id=a, caption="atomic a").id)
        with on_shard(id=b):
            seen.append(_schema())
            ids.append(Photo.objects.create(user_id=b, caption="atomic b").id)
            with transaction.atomic(using=where.alias):  # a savepoint
                ids.append(Photo.objects.create(user_id=b, caption="atomic b2").id)
        seen.append(_schema())
    try:
        with on_shard(id=a) as where, transaction.atomic(using=where.alias):
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
        "schemas": [schema_of(a), schema_of(b), schema_of(a)],
        "session": session_path("pg1"),
        "rolled_found": Photo.objects.filter(pk=rolled).exists(),
    }


def key_on(shard: int, n: int = 1) -> int:
    """A value of Photo's shard key that places a photo on ``shard`` (an ID minted there when the key
    holds IDs, else an integer the topology's rule routes there)."""
    topo = router().topology
    if Photo.shard_key_is_id:
        return topo.layout.encode(shard=shard) + n
    return shard + topo.modulus * n


def schema_of(user_id: int) -> str:
    """The schema of the shard inside a user's ID (where its photos live)."""
    return router().topology.schema_name(router().shard_of_id(user_id))


def semantics() -> dict:
    """Issue 41's Django cases, each on its own: a savepoint rolled back after another shard's block
    on the same host, ``transaction.atomic()`` without ``using=`` and ``atomic(using=<pg1>)`` around a
    write routed to pg2, a string pk, ``__in`` on the key and on the pk (inside another shard's block
    and outside every block), and a lookup on the key that cannot be routed. Each case records what
    the app saw; the test checks the rows in the databases."""
    from django.db import transaction

    r = router()
    host_of = {n: r.placement.locate(n).name for n in range(r.topology.shard_count)}
    a, b = [n for n in sorted(host_of) if host_of[n] == "pg1"][:2]
    c = next(n for n in sorted(host_of) if host_of[n] == "pg2")
    out: dict = {"a": a, "b": b, "c": c}

    def attempt(name: str, fn) -> None:
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001 - what the app saw is the result
            out[name] = {"refused": f"{type(exc).__name__}: {exc}"}

    def savepoint() -> dict:
        with on_shard(shard=a) as where, transaction.atomic(using=where.alias):
            first = Photo.objects.create(user_id=key_on(a), caption="sp a").id
            sid = transaction.savepoint(using=where.alias)
            with on_shard(shard=b):
                Photo.objects.filter(user_id=key_on(b)).count()  # the shard setting moves to b
                transaction.savepoint_rollback(sid, using=where.alias)
                second = Photo.objects.create(user_id=key_on(b), caption="sp b").id
                count_b = Photo.objects.filter(user_id=key_on(b)).count()
        return {"a_id": first, "b_id": second, "count_b": count_b}

    attempt("savepoint", savepoint)

    class Rollback(Exception):
        pass

    def rolled_back(open_block, key: int, caption: str) -> dict:
        made: list[int] = []
        try:
            with open_block():
                made.append(Photo.objects.create(user_id=key, caption=caption).id)
                raise Rollback
        except Rollback:
            pass
        return {"ids": made}

    attempt(
        "atomic_default",
        lambda: rolled_back(
            lambda: _both(on_shard(shard=a), transaction.atomic()), key_on(a, 2), "atomic default"
        ),
    )
    attempt(
        "atomic_other_host",
        lambda: rolled_back(
            lambda: transaction.atomic(using=r.placement.locate(a).name),
            key_on(c, 2),
            "atomic other host",
        ),
    )
    ids = {n: Photo.objects.create(user_id=key_on(n, 3), caption="in").id for n in (a, b, c)}
    out["ids"] = ids
    keys = [key_on(n, 3) for n in (a, b, c)]

    def string_pk() -> dict:
        with on_shard(shard=b):
            got = Photo.objects.get(pk=str(ids[c])).id
        return {"got": got, "count": Photo.objects.filter(user_id=str(keys[0])).count()}

    attempt("string_pk", string_pk)

    def key_in() -> dict:
        with on_shard(shard=a):
            in_block = Photo.objects.filter(user_id__in=keys).count()
            listed = sorted(p.id for p in Photo.objects.filter(user_id__in=keys))
        return {"in_block": in_block, "listed": listed}

    attempt("key_in", key_in)

    def pk_in() -> dict:
        outside = sorted(
            Photo.objects.filter(pk__in=list(ids.values())).values_list("id", flat=True)
        )
        with on_shard(shard=b):
            in_block = Photo.objects.filter(id__in=[ids[a], ids[c]]).count()
        return {"outside": outside, "in_block": in_block}

    attempt("pk_in", pk_in)

    def unroutable() -> dict:
        with on_shard(shard=a):
            return {"count": Photo.objects.filter(user_id__gt=0).count()}

    attempt("unroutable", unroutable)

    def fan_out() -> dict:
        from django.db.models import Max, Q

        from shardctl.django.models import UnroutableQuery

        listed = list(ids.values())
        with on_shard(shard=b):
            either = Photo.objects.filter(Q(user_id=keys[0]) | Q(user_id=keys[2])).count()
        every = Photo.objects.all_shards().filter(caption="in").count()
        refused = []
        newest = [p.id for p in Photo.objects.filter(pk__in=listed).order_by("-id")[:2]]
        first = Photo.objects.filter(pk__in=listed).first().id  # ordered by pk, sliced
        for call in (
            lambda: list(Photo.objects.filter(pk__in=listed).values_list("id").order_by("-id")[:2]),
            lambda: Photo.objects.filter(pk__in=listed).aggregate(Max("id")),
        ):
            try:
                call()
                refused.append(None)
            except UnroutableQuery as exc:
                refused.append(str(exc))
        updated = Photo.objects.filter(pk__in=listed).update(caption="in, updated")
        return {
            "either": either,
            "every": every,
            "newest": newest,
            "first": first,
            "refused": refused,
            "updated": updated,
        }

    attempt("fan_out", fan_out)
    from shardctl.errors import ShardMoved

    answer = ShardMiddleware(lambda request: None).process_exception(None, ShardMoved(c, "pg1"))
    out["moved_answer"] = [answer.status_code, answer["Retry-After"], answer.content.decode()]
    return out


@contextmanager
def _both(first, second):
    with first, second:
        yield


def _schema() -> str:
    here = current()
    with connections[here.alias].cursor() as cur:
        cur.execute("SELECT current_schema()")
        return cur.fetchone()[0]


def move() -> dict:
    """The live app server: writers (through the photo view's transaction) and ORM readers on the
    moving shards 4-7 and on two that stay, while they move pg1 -> pg2 (its topology file is the one
    the move rewrites). Prints its history's records; the test checks them with the stale app's."""
    from shardctl.model.topology import Topology
    from shardctl.ops.move import move_shards

    path = Path(os.environ["SHARDCTL_CONFIG"])

    def operation() -> dict:
        report = move_shards(Topology.load(path), MOVED, "pg2")
        return {"phase": report["phase"], "verified": report["verified"]}

    done, history = _traffic_during(
        operation, MOVED + [0, 9], keys_per_shard=4, name="live", writers=4, readers=2
    )
    return {**done, "records": _records(history)}


MOVED = [4, 5, 6, 7]


def stale() -> dict:
    """Another app server, whose topology file is a copy never updated: the same traffic until the test
    writes the live app's acknowledged IDs to $SHARDCTL_STOP; then it gets every acknowledged photo,
    the live app's and its own, by its ID alone through the view. Prints its records, what it could
    not find, and the redirects its Router followed."""
    stop = Path(os.environ["SHARDCTL_STOP"])

    def operation() -> dict:
        while not stop.exists():
            time.sleep(0.05)
        return {}

    _, history = _traffic_during(
        operation, MOVED + [0, 9], keys_per_shard=4, name="stale", writers=2, readers=1
    )
    ids = json.loads(stop.read_text()) + [w.id for w in history.writes]
    return {
        "records": _records(history),
        "missing": lookup_ids(ids),
        "redirects": router().redirects(),
    }


def lookup() -> dict:
    """GET /photos/<id> for every ID in $SHARDCTL_IDS: the ones not found."""
    return {"missing": lookup_ids(json.loads(Path(os.environ["SHARDCTL_IDS"]).read_text()))}


def lookup_ids(ids: list[int]) -> list:
    client = Client(raise_request_exception=False)
    missing = []
    for pid in ids:
        got = client.get(f"/photos/{pid}")
        if got.status_code != 200 or got.json()["id"] != pid:
            missing.append([pid, got.status_code])
    return missing


def migrate() -> dict:
    """Writers (through the photo view) and ORM readers on every shard while ``shardctl migrate`` (the
    CLI, as CI runs it) applies the fleet's pending migrations; the history is checked against every
    shard afterwards."""
    path = Path(os.environ["SHARDCTL_CONFIG"])

    def operation() -> dict:
        cli = [sys.executable, "-m", "shardctl", "--config", str(path), "migrate"]
        done = subprocess.run(cli, capture_output=True, text=True, timeout=300, check=False)
        return {"exit_code": done.returncode, "output": (done.stdout + done.stderr)[-2000:]}

    done, history = _traffic_during(operation, list(range(16)), keys_per_shard=2, name="app")
    checked = history.check()
    return {**done, "ok": checked.ok, "report": str(checked), "counts": checked.counts}


def _records(history) -> dict:
    """A history's records as JSON (the test merges two app servers' and checks them)."""
    from dataclasses import asdict

    return {
        "tag": history.tag,
        **{
            kind: [
                {**asdict(r), "ids": sorted(r.ids)} if kind == "reads" else asdict(r) for r in rows
            ]
            for kind, rows in (
                ("writes", history.writes),
                ("reads", history.reads),
                ("failures", history.failures),
                ("retries", history.retries),
            )
        },
    }


def _traffic_during(
    operation, shards: list[int], keys_per_shard: int, name: str, writers: int = 6, readers: int = 2
) -> tuple:
    """``operation()`` while ``writers`` and ``readers`` work on photos of users of ``shards``: (its result,
    the history). A writer posts a photo through the example's view (``POST /users/<id>/photos``, a
    transaction on the owner's shard that retries a move); any answer but 200 is an error the
    application saw. A reader asks the ORM for a user's photos and the schema that answered. The
    view's reruns after ``ShardMoved`` are the history's documented retries."""
    import logging

    from django.contrib.postgres.aggregates import ArrayAgg
    from django.db.models import Max, TextField
    from django.db.models.expressions import RawSQL

    from support.history import History, now

    path = Path(os.environ["SHARDCTL_CONFIG"])
    keys = [key_on(n, j) for j in range(1, keys_per_shard + 1) for n in shards]
    history = History(path, table="gram_photos", tag=os.environ.get("SHARDCTL_TAG"), key_is_id=True)
    halt = threading.Event()
    schema_sql = Max(RawSQL("current_schema()", (), output_field=TextField()))

    class Retries(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            history.retried(
                f"{name}-{threading.current_thread().name}", "view", None, record.getMessage()
            )

    logging.getLogger("shardctl.django").addHandler(Retries())
    logging.getLogger("shardctl.django").setLevel(logging.INFO)

    def write(client: str) -> None:
        rng, caption = random.Random(client), history.caption(client)
        web = Client(raise_request_exception=False)
        body = json.dumps({"caption": caption})
        while not halt.is_set():
            key, start = rng.choice(keys), now()
            try:
                got = web.post(f"/users/{key}/photos", body, content_type="application/json")
                if got.status_code != 200:
                    why = got.exc_info[1] if got.exc_info else got.content[:300]
                    raise RuntimeError(f"HTTP {got.status_code}: {why!r}")
            except Exception as exc:  # noqa: BLE001 - every error the application sees is recorded
                history.failed(client, "write", key, exc, start, now())
                continue
            history.acked(client, key, got.json()["id"], start, now())
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

    threads = [
        threading.Thread(target=write, args=(f"{name}-w{i}",), name=f"w{i}") for i in range(writers)
    ]
    threads += [
        threading.Thread(target=read, args=(f"{name}-r{i}",), name=f"r{i}") for i in range(readers)
    ]
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
    return done, history


def dsn_change() -> dict:
    """The host's DSN changes in the topology file (a pooler put in front, a password variable
    added) while an atomic block on one of its shards is open: the block must fail loudly, never
    lose its writes behind a success (closing its connection would end it without a commit)."""
    from django.db import transaction

    from shardctl.errors import ShardMoved

    r = router()
    path = r.topology.path
    text = path.read_text()
    key = key_on(0, 11)
    host = r.placement.locate(r.shard_of_id(key)).name
    raised, kept = None, None
    try:
        with on_shard(id=key) as where, transaction.atomic(using=where.alias):
            first = Photo.objects.create(user_id=key, caption="before the change").id
            old = r.topology.host(host).dsn
            changed = old + ("&" if "?" in old else "?") + "application_name=changed"
            path.write_text(text.replace(old, changed, 1))
            r.reload()
            Photo.objects.create(user_id=key, caption="after the change")
    except ShardMoved as exc:
        raised = str(exc)
    finally:
        path.write_text(text)
        r.reload()
    with on_shard(id=key):
        kept = Photo.objects.filter(pk=first).exists()
    return {"raised": raised, "kept": kept, "first": first}


def moved_before_the_first_write() -> dict:
    """An atomic block chose its shard's host; before its first statement, the shard is routed to
    another host (a redirect this process followed: a cutover's flip does the same). Its write must
    raise ShardMoved (``retry_on_move`` reruns the view), not UncoveredWrite, and nothing is written
    on either host."""
    import shardctl.django
    from shardctl.errors import ShardMoved

    r = router()
    key = key_on(0, 12)
    shard = r.shard_of_id(key)
    old = r.placement.locate(shard)
    other = next(h for h in r.topology.hosts if h.name != old.name)
    raised = None
    try:
        with shardctl.django.atomic(id=key):
            r.placement.redirects.follow(
                shard, {"host": other.name, "dsn": other.dsn}, r.topology, old
            )
            Photo.objects.create(user_id=key, caption="after the move")
    except ShardMoved as exc:
        raised = f"ShardMoved: {exc}"
    except Exception as exc:  # noqa: BLE001 - the answer names what was raised
        raised = f"{type(exc).__name__}: {exc}"
    written = 0
    for host in (old, other):  # the shard's schema is on its own host only
        with psycopg.connect(**host.connect_kwargs()) as conn:
            try:
                written += conn.execute(
                    f"SELECT count(*) FROM {r.topology.schema_name(shard)}.photos "
                    "WHERE caption = 'after the move'"
                ).fetchone()[0]
            except psycopg.errors.UndefinedTable:
                pass
    return {"raised": raised, "written": written}


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]]()))
