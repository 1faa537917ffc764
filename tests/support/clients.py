"""Clients that produce a :class:`~support.history.History`: Router threads, psql, pgbench.

* :func:`history_traffic`: N Router writers and M Router readers in threads for a ``with`` block.
  Writers ``router.run(key, INSERT … RETURNING id, current_schema())``; readers
  ``router.run(key, SELECT current_schema(), array_agg(id) … WHERE user_id = key)``.
* :func:`async_history_traffic`: the same with an :class:`~shardctl.router.AsyncRouter`: N writer
  and M reader tasks on one event loop (in a thread of its own), the same statements.
* :class:`PsqlClient`: one ``psql`` process per statement against the host the topology gives
  the key's shard (``dsn``: through a pooler when there is one), schema-qualified names. A
  "shard N moved to HOST" error (SQLSTATE SCM01) is the documented signal to re-read the
  topology and try again: recorded as a retry; any other error is recorded as a failure.
* :class:`PgbenchClient`: ``pgbench -f script`` bursts inserting into one shard; each burst's rows
  carry their own tag and its "number of transactions actually processed" is the acknowledged
  count (aborted clients make the burst's outcome ambiguous by their count).
"""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from shardctl.model.topology import Topology
from shardctl.router import Router

from .history import History, now

MOVED = "SCM01"


def keys_for(topo: Topology, shards: list[int], per_shard: int = 8) -> list[int]:
    """``per_shard`` integer keys routing to each of ``shards``."""
    return [n + topo.modulus * j for j in range(1, per_shard + 1) for n in shards]


class RouterTraffic:
    """Router writers and readers recording into ``history`` until :meth:`stop`."""

    READS: ClassVar[dict[str, str]] = {
        # What an application writes: the planner may answer from the index alone.
        "indexed": "SELECT current_schema(), array_agg(id), current_setting('port') FROM photos WHERE user_id = %s",
        # A scan of the shard's whole table (a moved shard's stub view raises on it whatever the filter).
        "scan": "SELECT current_schema(), array_agg(id) FILTER (WHERE user_id = %s), current_setting('port') "
        "FROM photos",
    }

    def __init__(
        self,
        history: History,
        router: Router,
        keys: list[int],
        writers: int,
        readers: int,
        pause: float = 0.002,
        read: str = "indexed",
    ):
        self.history, self.router, self.keys, self.pause = history, router, keys, pause
        self.read_sql = self.READS[read]
        self._halt = threading.Event()
        self.threads = [
            threading.Thread(target=self._write, args=(f"w{i}",), daemon=True)
            for i in range(writers)
        ]
        self.threads += [
            threading.Thread(target=self._read, args=(f"r{i}",), daemon=True)
            for i in range(readers)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self._halt.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self.threads), (
            "a Router client did not stop within 60 s"
        )

    def _write(self, client: str) -> None:
        rng = random.Random(client)
        caption = self.history.caption(client)
        while not self._halt.is_set():
            key = rng.choice(self.keys)
            start = now()
            try:
                id_, schema = self.router.run(
                    key,
                    lambda c, key=key: c.execute(
                        "INSERT INTO photos (user_id, caption) VALUES (%s, %s) "
                        "RETURNING id, current_schema()",
                        (key, caption),
                    ).fetchone(),
                )
            except Exception as exc:  # noqa: BLE001 - every error the application sees is recorded
                self.history.failed(client, "write", key, exc, start, now())
                continue
            self.history.acked(client, key, id_, start, now(), schema=schema)
            time.sleep(self.pause)

    def _read(self, client: str) -> None:
        rng = random.Random(client)
        while not self._halt.is_set():
            key = rng.choice(self.keys)
            start = now()
            try:
                schema, ids, server = self.router.run(
                    key, lambda c, key=key: c.execute(self.read_sql, (key,)).fetchone()
                )
            except Exception as exc:  # noqa: BLE001
                self.history.failed(client, "read", key, exc, start, now())
                continue
            self.history.read(client, key, schema, ids, start, now(), server=f"port {server}")
            time.sleep(self.pause)


@contextmanager
def history_traffic(
    path: Path,
    keys: list[int],
    *,
    writers: int = 6,
    readers: int = 2,
    history: History | None = None,
    warmup: float = 0.3,
    cooldown: float = 0.3,
    read: str = "indexed",
    pause: float = 0.01,
    **router_kwargs,
) -> Iterator[RouterTraffic]:
    """Router writers and readers on ``keys`` for the block (started ``warmup`` s before it, stopped
    ``cooldown`` s after it); ``traffic.history`` is the record, ``traffic.router`` the Router.

    Each client rests ``pause`` s between its statements: 6 writers still put a write in flight every
    couple of milliseconds (hundreds a second, through every phase of the operation), without the
    thousands a second that only took the CPU from the operation under test on a 2-core machine."""
    router_kwargs.setdefault("move_wait", 15)
    router = Router(Topology.load(path), **router_kwargs)
    traffic = RouterTraffic(
        history or History(path), router, keys, writers, readers, pause=pause, read=read
    )
    try:
        traffic.start()
        time.sleep(warmup)
        yield traffic
        time.sleep(cooldown)
    finally:
        traffic.stop()
        router.close()


class AsyncRouterTraffic:
    """:class:`RouterTraffic` with an AsyncRouter: writer and reader tasks on an event loop of its own
    thread, recording into ``history`` until :meth:`stop`."""

    def __init__(
        self,
        history: History,
        path: Path,
        keys: list[int],
        writers: int,
        readers: int,
        pause: float = 0.002,
        read: str = "indexed",
        **router_kwargs,
    ):
        self.history, self.path, self.keys, self.pause = history, path, keys, pause
        self.writers, self.readers = writers, readers
        self.read_sql = RouterTraffic.READS[read]
        self.router_kwargs = router_kwargs
        self.router = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.crashed: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the async Router clients did not stop within 60 s"
        if self.crashed is not None:
            raise self.crashed

    async def _main(self) -> None:
        from shardctl.router import AsyncRouter

        try:
            async with AsyncRouter(Topology.load(self.path), **self.router_kwargs) as router:
                self.router = router
                await asyncio.gather(
                    *[self._write(router, f"w{i}") for i in range(self.writers)],
                    *[self._read(router, f"r{i}") for i in range(self.readers)],
                )
                self.stats = router.stats()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread by stop()
            self.crashed = exc

    async def _write(self, router, client: str) -> None:
        rng = random.Random(client)
        caption = self.history.caption(client)
        while not self._halt.is_set():
            key = rng.choice(self.keys)

            async def work(conn, key=key):
                cur = await conn.execute(
                    "INSERT INTO photos (user_id, caption) VALUES (%s, %s) "
                    "RETURNING id, current_schema()",
                    (key, caption),
                )
                return await cur.fetchone()

            start = now()
            try:
                id_, schema = await router.run(key, work)
            except Exception as exc:  # noqa: BLE001 - every error the application sees is recorded
                self.history.failed(client, "write", key, exc, start, now())
                continue
            self.history.acked(client, key, id_, start, now(), schema=schema)
            await asyncio.sleep(self.pause)

    async def _read(self, router, client: str) -> None:
        rng = random.Random(client)
        while not self._halt.is_set():
            key = rng.choice(self.keys)
            start = now()
            try:
                [(schema, ids, server)] = await router.read(key, self.read_sql, (key,))
            except Exception as exc:  # noqa: BLE001
                self.history.failed(client, "read", key, exc, start, now())
                continue
            self.history.read(client, key, schema, ids, start, now(), server=f"port {server}")
            await asyncio.sleep(self.pause)


@contextmanager
def async_history_traffic(
    path: Path,
    keys: list[int],
    *,
    writers: int = 6,
    readers: int = 2,
    history: History | None = None,
    warmup: float = 0.3,
    cooldown: float = 0.3,
    read: str = "indexed",
    pause: float = 0.01,
    **router_kwargs,
) -> Iterator[AsyncRouterTraffic]:
    """:func:`history_traffic` with an AsyncRouter (writers ``await router.run(key, work)``, readers
    ``await router.read(key, ...)``)."""
    router_kwargs.setdefault("move_wait", 15)
    traffic = AsyncRouterTraffic(
        history or History(path), path, keys, writers, readers, pause, read=read, **router_kwargs
    )
    try:
        traffic.start()
        time.sleep(warmup)
        yield traffic
        time.sleep(cooldown)
    finally:
        traffic.stop()


class _ProcessClient(threading.Thread):
    def __init__(self, history: History, path: Path, bin_dir: str | Path, name: str):
        super().__init__(daemon=True, name=name)
        self.history, self.path, self.bin_dir, self.client = (
            history,
            Path(path),
            Path(bin_dir),
            name,
        )
        self._halt = threading.Event()
        self.crashed: BaseException | None = None
        self._dsns: dict[int, str] = {}

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self._halt.set()
        self.join(timeout=60)
        assert not self.is_alive(), f"{self.client} did not stop within 60 s"
        if self.crashed is not None:
            raise self.crashed

    def run(self) -> None:
        try:
            self.loop()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread by __exit__
            self.crashed = exc

    def dsn(self, shard: int) -> str:
        """The shard's host as the topology file named it when this client last looked (a direct
        client keeps its connection target until it is told the shard moved: :meth:`forget`)."""
        if shard not in self._dsns:
            self._dsns[shard] = Topology.load(self.path).host_of(shard).dsn_for("app")
        return self._dsns[shard]

    def forget(self, shard: int) -> None:
        self._dsns.pop(shard, None)


class PsqlClient(_ProcessClient):
    """psql, one process per statement: inserts into and reads from ``insta<n>.photos`` by name.

    It rests ``pause`` s between statements, like the Router clients (:func:`history_traffic`): still
    dozens of statements a second through every phase, without the thousands of psql processes and
    backends a move test spawned with no rest."""

    def __init__(
        self,
        history: History,
        path: Path,
        bin_dir: str | Path,
        keys: list[int],
        name: str = "psql",
        pause: float = 0.01,
    ):
        super().__init__(history, path, bin_dir, name)
        self.keys = keys
        self.pause = pause
        self.modulus = Topology.load(path).modulus
        self.schema = Topology.load(path).schema_name

    def psql(self, shard: int, sql: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                str(self.bin_dir / "psql"),
                "-X",
                "-q",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-v",
                "VERBOSITY=verbose",
                "-d",
                self.dsn(shard),
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def attempt(self, op: str, key: int, sql: str) -> str | None:
        """Run ``sql`` for ``key``'s shard until it succeeds or fails for another reason than a move."""
        shard = key % self.modulus
        for _ in range(20):
            start = now()
            out = self.psql(shard, sql)
            if out.returncode == 0:
                return out.stdout
            if MOVED in out.stderr:
                self.history.retried(self.client, op, key, out.stderr)
                self.forget(shard)
                time.sleep(0.05)
                continue  # re-resolve the host from the topology file and try again
            self.history.failed(
                self.client, op, key, out.stderr or f"psql exit {out.returncode}", start, now()
            )
            return None
        self.history.failed(self.client, op, key, "still moving after 20 tries", now(), now())
        return None

    def loop(self) -> None:
        rng = random.Random(self.client)
        caption = self.history.caption(self.client)
        while not self._halt.is_set():
            key = rng.choice(self.keys)
            table = f"{self.schema(key % self.modulus)}.photos"
            start = now()
            out = self.attempt(
                "write",
                key,
                f"INSERT INTO {table} (user_id, caption) VALUES ({key}, '{caption}') RETURNING id",
            )
            if out is not None:
                self.history.acked(self.client, key, int(out.split()[0]), start, now())
            self._halt.wait(self.pause)
            # another key: a read may go to a host no write told of the move yet
            key = rng.choice(self.keys)
            table = f"{self.schema(key % self.modulus)}.photos"
            start = now()
            out = self.attempt(
                "read",
                key,
                f"SELECT '{self.schema(key % self.modulus)}', "
                f"coalesce(string_agg(id::text, ','), '') FROM {table} "
                f"WHERE user_id = {key}",
            )
            if out is not None:
                schema, _, ids = out.strip().partition("|")
                self.history.read(
                    self.client, key, schema, [int(i) for i in ids.split(",") if i], start, now()
                )
            self._halt.wait(self.pause)


class PgbenchClient(_ProcessClient):
    """``pgbench -f`` bursts of ``seconds`` inserting into shard ``shard`` (``clients`` connections, at most
    ``rate`` transactions a second: the machine's CPUs are shared)."""

    PROCESSED = re.compile(r"number of transactions actually processed: (\d+)")

    def __init__(
        self,
        history: History,
        path: Path,
        bin_dir: str | Path,
        shard: int,
        workdir: Path,
        clients: int = 2,
        seconds: float = 1,
        rate: int = 200,
        name: str | None = None,
    ):
        super().__init__(history, path, bin_dir, name or f"pgbench{shard}")
        self.shard, self.workdir, self.clients, self.seconds, self.rate = (
            shard,
            Path(workdir),
            clients,
            seconds,
            rate,
        )
        self.bursts = 0
        self.acked = 0

    def script(self, tag: str) -> Path:
        topo = Topology.load(self.path)
        path = self.workdir / f"{self.client}-{self.bursts}.sql"
        path.write_text(
            f"\\set j random(1, 50)\n"
            f"\\set uid {self.shard} + {topo.modulus} * :j\n"
            f"INSERT INTO {topo.schema_name(self.shard)}.photos (user_id, caption) "
            f"VALUES (:uid, '{tag}');\n"
        )
        return path

    def loop(self) -> None:
        while not self._halt.is_set():
            self.bursts += 1
            tag = self.history.caption(f"{self.client}-{self.bursts}")
            out = subprocess.run(
                [
                    str(self.bin_dir / "pgbench"),
                    "-n",
                    "-f",
                    str(self.script(tag)),
                    "-c",
                    str(self.clients),
                    "-j",
                    "1",
                    "-T",
                    str(self.seconds),
                    "-R",
                    str(self.rate),
                    self.dsn(self.shard),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            found = self.PROCESSED.search(out.stdout)
            acked = int(found.group(1)) if found else 0
            aborted = len(re.findall(r"client \d+ aborted", out.stderr))
            self.acked += acked
            self.history.batch(self.client, tag, acked, ambiguous=aborted)
            if out.returncode != 0:
                if MOVED in out.stderr or "moved to" in out.stderr:
                    self.history.retried(self.client, "pgbench", None, out.stderr[-300:])
                    self.forget(self.shard)
                else:
                    self.history.failed(
                        self.client,
                        "pgbench",
                        None,
                        out.stderr[-500:] or out.stdout[-500:],
                        now(),
                        now(),
                    )
                    time.sleep(0.2)
