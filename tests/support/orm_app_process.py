"""The SQLAlchemy example app as an app server of its own, in a process (tests only; see
support.web.OrmAppProcess): writers post photos with the example's ``post_photo`` and readers read a
key's photo IDs and the schema that answered, each in a plain session of the example's
``make_sessions()`` ($SHARDCTL_CONFIG), until the file ``STOP`` exists. Every operation, and every
move the sessions followed, is printed as one JSON line.

    python orm_app_process.py KEYS(comma-separated) STOP CAPTION_TAG NAME WRITERS READERS
"""

from __future__ import annotations

import logging
import os
import random
import time

from app import make_sessions, post_photo  # examples/sqlalchemy_app on the path
from app_clients import args, json_lines, run_clients  # this directory
from models import Photo
from sqlalchemy import func, select

from shardctl.errors import ShardMoved


def main() -> None:
    run = args()
    keys, stop, tag, name = run.keys, run.stop, run.tag, run.name
    logging.basicConfig(level=logging.WARNING)  # the Router's redirect warnings, on stderr
    Session = make_sessions()

    emit = json_lines()

    follow = Session.shards.follow_move

    def followed(exc):  # the sessions' follows: the history's documented retries
        moved = follow(exc)
        if moved:
            emit(op="retried", client=name, key=None, error=str(exc.orig)[:200])
        return moved

    Session.shards.follow_move = followed

    def loop(client: str, write: bool) -> None:
        rng = random.Random(client)
        while not os.path.exists(stop):
            key, start = rng.choice(keys), time.time()
            try:
                if write:
                    photo = post_photo(Session, key, f"{tag} {client}")
                    emit(
                        op="acked",
                        client=client,
                        key=key,
                        id=photo.id,
                        start=start,
                        end=time.time(),
                    )
                else:
                    query = select(func.current_schema(), func.array_agg(Photo.id))
                    with Session() as session:
                        schema, ids = session.execute(query.where(Photo.user_id == key)).one()
                    doc = {"schema": schema, "ids": ids or [], "start": start, "end": time.time()}
                    emit(op="read", client=client, key=key, **doc)
            except ShardMoved as exc:
                emit(op="retried", client=name, key=key, error=str(exc))
            except Exception as exc:  # noqa: BLE001 - every error the application sees is recorded
                error = f"{type(exc).__name__}: {exc}"[:300]
                emit(op="failed", client=client, key=key, error=error, start=start, end=time.time())
            time.sleep(0.01)

    run_clients(run, loop)
    Session.shards.router.close()


if __name__ == "__main__":
    main()
