"""The adoption's run, as recorded on the database being adopted (the *source*): one row of
``shardctl_adopt.run`` with its phase, the plan's hash, the topology's path and a ``detail`` document
(replica identities replaced, per-host copy state and figures, the ID floor). Every step of ``adopt``
reads it first and writes it as soon as it has done something a re-run must know about, so SIGKILL
at any point leaves a record a re-run continues from.

Phases: ``new -> copying -> synced -> cut_over -> cleaned``, and ``aborted``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import psycopg

from ...sql.catalog import adopt_copy as catalog


class Phase(str, Enum):
    NEW = "new"
    COPYING = "copying"
    SYNCED = "synced"
    CUT_OVER = "cut_over"
    CLEANED = "cleaned"
    ABORTED = "aborted"

    def __str__(self) -> str:
        return self.value


def plan_hash(doc: dict[str, Any]) -> str:
    """What identifies a plan: its tables and where they go (not its query report or timings)."""
    tables = sorted((t["name"], t["kind"], t.get("key"), t.get("id_column")) for t in doc["tables"])
    text = json.dumps([doc["schema"], doc["root"], doc.get("shard_count"), tables])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def slot_name(host: str) -> str:
    """Publication = slot = subscription name for one fleet host (a slot name is [a-z0-9_] only)."""
    slug = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in host.lower())
    return f"shardctl_adopt_{slug}"[:63]


@dataclass
class Run:
    """The run's record (``detail`` is changed in place, then :meth:`save`\\ d)."""

    phase: Phase
    plan_hash: str
    topology: str | None
    started_at: Any = None
    updated_at: Any = None
    detail: dict[str, Any] = field(default_factory=dict)

    def host(self, name: str) -> dict[str, Any]:
        """The detail of one fleet host's copy: ``copied``, ``rows``, ``bytes``, ``tables``."""
        return self.detail.setdefault("hosts", {}).setdefault(name, {"copied": False})

    def save(self, conn: psycopg.Connection, phase: Phase | None = None) -> None:
        if phase is not None:
            self.phase = phase
        catalog.write_run(conn, str(self.phase), self.plan_hash, self.topology, self.detail)


def load_run(conn: psycopg.Connection) -> Run | None:
    row = catalog.read_run(conn)
    if row is None:
        return None
    return Run(
        Phase(row.phase), row.plan_hash, row.topology, row.started_at, row.updated_at, row.detail
    )


def start_run(conn: psycopg.Connection, digest: str, topology: str | None) -> Run:
    """A new run's record (the state schema made first if needed)."""
    catalog.ensure_run_table(conn)
    run = Run(Phase.NEW, digest, topology, detail={"hosts": {}})
    run.save(conn)
    return load_run(conn) or run
