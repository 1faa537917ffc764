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
import secrets
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


NAME_MAX = 63  # NAMEDATALEN - 1: the longest name PostgreSQL keeps


def slot_name(host: str, tag: str = "") -> str:
    """The one name of an adoption's replication objects (publication = slot = subscription) for
    ``host``: a fleet host's name, ``ids`` (the id map's), ``back_<host>`` (the way back's).

    Slots are the server's, not the database's, so two adoptions from (or into) one server need
    names of their own: ``tag`` is the run's (:func:`run_tag`). No tag (a run recorded before tags
    existed): the names such a run made, so it can still be finished. Names are [a-z0-9_] and at
    most 63 bytes; a longer one keeps a hash of the whole, so long host names never collide."""
    slug = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in host.lower())
    name = f"shardctl_adopt_{slug}"
    if not tag:
        return name[:NAME_MAX]
    tail = f"_{tag}"
    if len(name) + len(tail) <= NAME_MAX:
        return name + tail
    digest = hashlib.sha256(slug.encode()).hexdigest()[:8]
    return f"{name[: NAME_MAX - len(tail) - len(digest) - 1]}_{digest}{tail}"


def new_tag() -> str:
    """A new run's tag: random, so no other adoption on any server it touches shares its names."""
    return secrets.token_hex(4)


def run_tag(run: Run | dict[str, Any] | None) -> str:
    """The tag of a run (or of its ``detail``) for :func:`slot_name`; "" without a run, or for a run
    recorded before tags existed (its objects carry the untagged names)."""
    detail = run.detail if isinstance(run, Run) else run
    return str((detail or {}).get("tag") or "")


def copy_tag(run: Run | None) -> str:
    """The tag ``adopt copy`` names its objects with: the recorded run's, unless a new run starts
    (none recorded, or one aborted or cleaned up before tags existed: its objects are gone)."""
    if run is not None and (run_tag(run) or run.phase not in (Phase.ABORTED, Phase.CLEANED)):
        return run_tag(run)
    return new_tag()


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


def start_run(conn: psycopg.Connection, digest: str, topology: str | None, tag: str) -> Run:
    """A new run's record (the state schema made first if needed), with the tag of its objects'
    names (:func:`slot_name`), recorded before any of them is made."""
    catalog.ensure_run_table(conn)
    detail: dict[str, Any] = {"hosts": {}}
    if tag:
        detail["tag"] = tag
    run = Run(Phase.NEW, digest, topology, detail=detail)
    run.save(conn)
    return load_run(conn) or run
