"""The control schema's ledger on one host: creating it, events, and the checksum cache.

``migrate`` compares the ledger's checksums with the rendered files. Rendering every applied
migration for every shard costs ~15 µs a time, which adds up (4096 shards × 100 versions ≈ 6 s),
so each host keeps in ``shardctl.meta`` the versions it has already verified, keyed by the file's
source hash, the topology's rendering context and a digest of that version's ledger rows. A version
whose three keys still match is known good without rendering; any change to the file, the topology
or the ledger re-renders it. ``init`` and ``migrate`` both refresh the cache after they change a host.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from ..model.ranges import format_shards, parse_shards
from ..model.topology import Topology
from ..sql.catalog import ledger as ledger_q
from ..sql.catalog.control import control_exists, ensure_catalog_watch
from ..sql.migrations import Migration
from ..sql.render import layout_context, render_control, shard_context

CACHE_KEY = "migrate.verified"


def ensure_control_schema(conn: psycopg.Connection, topo: Topology | None = None) -> bool:
    """Create the control schema if missing (call under the host lock), and the watch of the
    database's DDL when the role may (status's fingerprint cache). True if the schema was created."""
    created = not control_exists(conn)
    if created:
        with conn.transaction():
            conn.execute(render_control(topo))
    ensure_catalog_watch(conn)
    return created


def log_event(
    conn: psycopg.Connection, kind: str, shards: list[int], detail: dict[str, Any]
) -> None:
    with conn.transaction():
        ledger_q.insert_event(
            conn, kind, format_shards(shards) if shards else None, json.dumps(detail, default=str)
        )


def recorded_failures(conn: psycopg.Connection) -> dict[int, int]:
    """Shard → the highest version a ``migrate`` run recorded it failing at (the events'
    ``failed_versions``); the caller compares it with the shard's version now."""
    out: dict[int, int] = {}
    for version, shards in ledger_q.failed_versions(conn):
        for n in parse_shards(shards):
            out[n] = max(out.get(n, 0), int(version))
    return out


@dataclass
class Drift:
    """An applied migration whose rendered SQL no longer matches the ledger."""

    version: int
    file: str
    shards: list[int] = field(default_factory=list)


@dataclass
class Integrity:
    """Result of comparing a host's ledger with the migration files."""

    drift: list[Drift] = field(default_factory=list)
    # applied version with no file → shards
    orphans: dict[int, list[int]] = field(default_factory=dict)
    # version → cache entry, every row on the host verified
    clean: dict[int, dict] = field(default_factory=dict)
    rendered: int = 0  # renders this check needed
    cached: int = 0  # versions known good from the cache


@functools.cache
def _renderer_digest() -> str:
    """The code that turns a migration file into SQL: any change to it re-verifies every version."""
    from ..model import identifiers
    from ..sql import migrations, render
    from ..version import __version__

    digest = hashlib.sha256(__version__.encode())
    for module in (identifiers, migrations, render):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def context_digest(topo: Topology) -> str:
    """What, besides the file, a migration's rendering depends on."""
    doc = {
        "renderer": _renderer_digest(),
        "schema": topo.schema_format,
        "count": topo.shard_count,
        "function": topo.function,
        "layout": layout_context(topo.layout),
        "first": shard_context(topo, 0),
        "last": shard_context(topo, max(0, topo.shard_count - 1)),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def ledger_digests(conn: psycopg.Connection) -> dict[int, str]:
    """Per version, a digest of its ledger rows (shard, checksum): one query, no sort."""
    return {v: f"{n}:{total}" for v, n, total in ledger_q.version_digests(conn)}


def read_cache(conn: psycopg.Connection) -> dict:
    if not ledger_q.meta_exists(conn):
        return {}
    value = ledger_q.read_meta(conn, CACHE_KEY)
    return value if isinstance(value, dict) else {}


def write_cache(conn: psycopg.Connection, topo: Topology, clean: dict[int, dict]) -> None:
    if not ledger_q.meta_exists(conn):
        return
    value = {
        "context": context_digest(topo),
        "versions": {str(v): e for v, e in sorted(clean.items())},
    }
    with conn.transaction():
        ledger_q.write_meta(conn, CACHE_KEY, json.dumps(value))


def _known_good(
    conn: psycopg.Connection,
    topo: Topology,
    by_version: dict[int, Migration],
    use_cache: bool,
    verified: dict[int, dict] | None,
    result: Integrity,
) -> tuple[dict[int, str], list[int]]:
    """Versions the cache (or this run) vouches for go to ``result.clean``; returns the ledger digests
    and the versions left to render."""
    digests = ledger_digests(conn)
    cache = read_cache(conn) if use_cache else {}
    known = cache.get("versions", {}) if cache.get("context") == context_digest(topo) else {}
    to_read: list[int] = []
    for v, digest in digests.items():
        m = by_version.get(v)
        entry = {"source": m.source_digest, "ledger": digest} if m else None
        if entry is not None and (known.get(str(v)) == entry or (verified or {}).get(v) == entry):
            result.clean[v] = entry
            result.cached += 1
        else:
            to_read.append(v)
    return digests, to_read


def check_integrity(
    conn: psycopg.Connection,
    topo: Topology,
    migrations: list[Migration],
    shards: list[int] | None,
    *,
    use_cache: bool = True,
    verified: dict[int, dict] | None = None,
) -> Integrity:
    """Applied migrations whose checksum changed (drift) and applied versions with no file (orphans).

    ``shards``: report only these (None: every shard on the host). Versions whose every ledger row on
    the host matches come back in ``clean`` (for the cache); versions the cache vouches for are not
    rendered again, nor are those in ``verified`` (a ``clean`` of this run) whose rows are unchanged.
    """
    result = Integrity()
    by_version = {m.version: m for m in migrations}
    digests, to_read = _known_good(conn, topo, by_version, use_cache, verified, result)
    if not to_read:
        return result
    wanted = None if shards is None else set(shards)
    bad: set[int] = set()
    drift: dict[int, Drift] = {}
    rows = ledger_q.version_checksums(conn, to_read)
    context_of, context = -1, None  # one context per shard, shared by its versions
    for shard, version, stored in rows:
        m = by_version.get(version)
        in_scope = wanted is None or shard in wanted
        if m is None:
            if in_scope:
                result.orphans.setdefault(version, []).append(shard)
            continue
        if not 0 <= shard < topo.shard_count:
            bad.add(version)  # a shard this topology cannot render: never vouch for the version
            continue
        result.rendered += 1
        if shard != context_of:
            context_of, context = shard, shard_context(topo, shard)
        if not m.matches(topo, shard, stored, context):
            bad.add(version)
            if in_scope:
                drift.setdefault(version, Drift(version, m.name)).shards.append(shard)
    for v in to_read:
        if v in by_version and v not in bad:
            result.clean[v] = {"source": by_version[v].source_digest, "ledger": digests[v]}
    for d in drift.values():
        d.shards.sort()
    result.drift = sorted(drift.values(), key=lambda d: d.version)
    result.orphans = {v: sorted(s) for v, s in sorted(result.orphans.items())}
    return result


def find_drift(
    conn: psycopg.Connection, topo: Topology, migrations: list[Migration], shards: list[int]
) -> tuple[list[Drift], dict[int, list[int]]]:
    """Applied migrations whose checksum changed, and applied versions with no file (version → shards)."""
    result = check_integrity(conn, topo, migrations, shards)
    return result.drift, result.orphans


def refresh_cache(
    conn: psycopg.Connection,
    topo: Topology,
    migrations: list[Migration],
    verified: dict[int, dict] | None = None,
) -> Integrity:
    """Verify every ledger row on the host (re-rendering only what changed) and record the clean versions."""
    cache = read_cache(conn)
    result = check_integrity(conn, topo, migrations, None, verified=verified)
    value = {
        "context": context_digest(topo),
        "versions": {str(v): e for v, e in sorted(result.clean.items())},
    }
    if value != cache:
        write_cache(conn, topo, result.clean)
    return result


def repair(
    conn: psycopg.Connection, topo: Topology, migrations: list[Migration], drift: list[Drift]
) -> int:
    """Record the current checksum of changed migrations. Returns the ledger rows updated."""
    by_version = {m.version: m for m in migrations}
    updated = 0
    with conn.transaction():
        for d in drift:
            m = by_version[d.version]
            for shard in d.shards:
                updated += ledger_q.set_checksum(
                    conn, shard, d.version, m.checksum_for(topo, shard)
                )
    log_event(
        conn,
        "repair",
        sorted({s for d in drift for s in d.shards}),
        {"versions": [d.version for d in drift], "files": [d.file for d in drift], "rows": updated},
    )
    return updated
