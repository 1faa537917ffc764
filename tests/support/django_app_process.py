"""The Django example app as an app server of its own, in a process (Django's settings are per
process; see support.orm.OrmAppProcess, which runs it with ``script=DJANGO_APP_PROCESS``): writers
post photos through the example's view (``POST /users/<id>/photos``, a transaction on the owner's
shard that retries a move) and readers ask the ORM for a key's photo IDs and the schema that
answered, until the file ``STOP`` exists. Every operation is printed as one JSON line, in the format
of support/orm_app_process.py.

    python django_app_process.py KEYS(comma-separated) STOP CAPTION_TAG NAME WRITERS READERS
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "examples" / "django_app"), str(ROOT)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gramsite.settings")

import django

django.setup()

from app_clients import args, json_lines, run_clients  # this directory (the script's)
from django.contrib.postgres.aggregates import ArrayAgg
from django.db import connections
from django.db.models import Max, TextField
from django.db.models.expressions import RawSQL
from django.test import Client
from gram.models import Photo


def main() -> None:
    run = args()
    keys, stop, tag, name = run.keys, run.stop, run.tag, run.name
    schema_sql = Max(RawSQL("current_schema()", (), output_field=TextField()))

    emit = json_lines()

    class Retries(logging.Handler):  # the view's reruns after ShardMoved: documented retries
        def emit(self, record: logging.LogRecord) -> None:
            emit(op="retried", client=name, key=None, error=record.getMessage()[:200])

    logging.getLogger("shardctl.django").addHandler(Retries())
    logging.getLogger("shardctl.django").setLevel(logging.INFO)

    def loop(client: str, write: bool) -> None:
        rng, web = random.Random(client), Client(raise_request_exception=False)
        body = json.dumps({"caption": f"{tag} {client}"})
        while not os.path.exists(stop):
            key, start = rng.choice(keys), time.time()
            try:
                if write:
                    got = web.post(f"/users/{key}/photos", body, content_type="application/json")
                    if got.status_code != 200:
                        why = got.exc_info[1] if got.exc_info else got.content[:300]
                        raise RuntimeError(f"HTTP {got.status_code}: {why!r}")
                    doc = {"id": got.json()["id"]}
                    emit(op="acked", client=client, key=key, start=start, end=time.time(), **doc)
                else:
                    got = Photo.objects.filter(user_id=key).aggregate(
                        ids=ArrayAgg("id"), schema=schema_sql
                    )
                    if got["schema"] is not None:
                        doc = {"schema": got["schema"], "ids": got["ids"] or []}
                        emit(op="read", client=client, key=key, start=start, end=time.time(), **doc)
            except Exception as exc:  # noqa: BLE001 - every error the application sees is recorded
                error = f"{type(exc).__name__}: {exc}"[:300]
                emit(op="failed", client=client, key=key, error=error, start=start, end=time.time())
            time.sleep(0.01)
        connections.close_all()

    run_clients(run, loop)


if __name__ == "__main__":
    main()
