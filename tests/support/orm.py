"""The SQLAlchemy example app and a look at every row of a table, shard by shard (the sync and the
asyncio SQLAlchemy tests share them)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

from support.fleet import load
from support.process import process_env

APP = Path(__file__).resolve().parents[2] / "examples" / "sqlalchemy_app"


def example():
    """The example app's modules (models, app), imported from examples/sqlalchemy_app."""
    if str(APP) not in sys.path:
        sys.path.insert(0, str(APP))
    return importlib.import_module("models"), importlib.import_module("app")


def user_ids(topo, shards: list[int], per_shard: int = 1) -> list[int]:
    """``per_shard`` user IDs on each of ``shards`` (the example's photos live on their owner's shard:
    the shard inside ``user_id``), shard after shard."""
    return [topo.layout.encode(shard=n, time=1000 + j) for n in shards for j in range(per_shard)]


def rows_in(topo, table: str) -> dict[int, tuple[str, str, tuple]]:
    """Every row of ``table`` in every shard schema of every host, by id: (host, schema, row)."""
    out: dict[int, tuple[str, str, tuple]] = {}
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(purpose="admin"), autocommit=True) as conn:
            for shard in host.shards:
                schema = topo.schema_name(shard)
                for row in conn.execute(f'SELECT * FROM "{schema}".{table}'):
                    assert row[0] not in out, (
                        f"id {row[0]} twice: {out[row[0]][:2]} and {(host.name, schema)}"
                    )
                    out[row[0]] = (host.name, schema, row)
    return out


def add_filter_migration(path: Path, version: str, table: str, tagged: str) -> None:
    """A migration shaped like an application's, added to the fleet of topology ``path``: a column with a
    default on ``table``, a backfill of the rows whose caption starts with ``tagged``, and an index."""
    (path.parent / "migrations" / f"V{version}__photo_filter.sql").write_text(
        f"ALTER TABLE {{{{ schema|ident }}}}.{table} ADD COLUMN filter text NOT NULL DEFAULT 'none';\n"
        f"UPDATE {{{{ schema|ident }}}}.{table} SET filter = 'legacy' WHERE caption LIKE '{tagged}%';\n"
        f"CREATE INDEX {table}_filter_idx ON {{{{ schema|ident }}}}.{table} (filter);\n"
    )


def migrated_under_traffic(path: Path, result, history, table: str = "photos") -> None:
    """After ``migrate`` (CLI ``result``) ran under ORM traffic recorded in ``history``: it succeeded, the
    history checker finds nothing wrong (no error the application saw, nothing lost, doubled or read from
    a wrong shard) over enough traffic, and the column reached every shard."""
    assert result.exit_code == 0, result
    checked = history.check()
    print(checked)
    assert checked.ok, checked
    assert checked.counts["writes"] > 50 and checked.counts["reads"] > 20, checked
    topo = load(path)
    assert len(schemas_with_column(topo, table, "filter")) == topo.shard_count


def moved_under_traffic(report: dict, history, log_text: str) -> None:
    """After a move of pg1's shards to pg2 (``report``) under the ORM traffic of a live app server and a
    stale one, recorded in ``history`` as clients ``live`` and ``stale``: the move cut over and
    verified, the history checker finds nothing wrong over enough traffic, the stale app server
    followed the old host's redirect (``log_text``: the captured log), and both ran their work again
    (the live one's Router still routed by the file it had read)."""
    assert report["phase"] == "cut_over" and report["verified"] is True, report
    checked = history.check()
    print(checked)
    assert checked.ok, checked
    assert checked.counts["writes"] > 50 and checked.counts["reads"] > 20, checked
    assert "moved from pg1 to pg2" in log_text
    assert {r.client for r in history.retries} == {"live", "stale"}, checked


def schemas_with_column(topo, table: str, column: str) -> list[str]:
    """The shard schemas, over every host, whose ``table`` has ``column`` (a migration reached them)."""
    found: list[str] = []
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(purpose="admin"), autocommit=True) as conn:
            found += [
                row[0]
                for row in conn.execute(
                    "SELECT table_schema FROM information_schema.columns"
                    " WHERE table_name = %s AND column_name = %s AND table_schema = ANY(%s)",
                    (table, column, [topo.schema_name(n) for n in host.shards]),
                )
            ]
    return sorted(found)


class OrmAppProcess:
    """The SQLAlchemy example as a second app server, in a process of its own
    (``support/orm_app_process.py``; or ``script``: the Django example's, django_app_process.py)
    on the topology file ``path``: its writers and readers (client
    names ``clients``) are fed into ``history`` as they report, its sessions' follows of a move as
    retries of ``name``. Started (and reporting) on entry; stopped after its clients outlast the block."""

    def __init__(
        self,
        history,
        path: Path,
        keys: list[int],
        name: str,
        writers: int,
        readers: int,
        script: Path | None = None,
    ):
        self.history, self.path, self.name = history, Path(path), name
        self.script = script or Path(__file__).with_name("orm_app_process.py")
        self.argv = [
            ",".join(map(str, keys)),
            str(self.path.with_name(f"stop-{name}")),
            history.tag,
        ]
        self.argv += [name, str(writers), str(readers)]
        self.clients = {f"{name}-w{i}" for i in range(writers)}
        self.clients |= {f"{name}-r{i}" for i in range(readers)}
        self.reported = threading.Event()

    def __enter__(self) -> OrmAppProcess:
        env = process_env({"SHARDCTL_CONFIG": str(self.path)})
        env["PYTHONPATH"] = f"{APP}:{env['PYTHONPATH']}"
        self.log = self.path.with_name(f"{self.name}.log")
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(self.script), *self.argv],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
        self.feeder = threading.Thread(target=self._feed, daemon=True)
        self.feeder.start()
        deadline = time.monotonic() + 120  # its imports take long on a loaded machine
        while not self.reported.wait(0.2):
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, (
                f"no report from the app process: {self.log.read_text()}"
            )
        return self

    def _feed(self) -> None:
        h = self.history
        for line in self.proc.stdout:
            d = json.loads(line)
            op, client, key = d["op"], d["client"], d["key"]
            if op == "acked":
                h.acked(client, key, d["id"], d["start"], d["end"])
            elif op == "read":
                h.read(client, key, d["schema"], d["ids"], d["start"], d["end"])
            elif op == "retried":
                h.retried(client, "session", key, d["error"])
            else:
                h.failed(client, "request", key, d["error"], d["start"], d["end"])
            self.reported.set()

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:  # the block ran: let the traffic outlast it
            self.history.settle(self.clients)
        Path(self.argv[1]).touch()
        try:
            self.proc.wait(timeout=60)
        finally:
            self.proc.kill()
        self.feeder.join(timeout=10)
        assert self.proc.returncode == 0, self.log.read_text()
