"""A shard schema's catalog fingerprint: every object a migration makes, as schema-name-neutral text.

One row per object (``kind``, ``tbl`` (the table it belongs to, or ''), ``name``, ``def``) for
tables, columns (position, type, default, nullability, collation, identity/generated, privileges),
constraints, indexes, sequences' settings, functions (signature, attributes, privileges and an md5
of the body), triggers, views, types (enums with their labels, domains, ranges), row-level
security policies, default privileges, and the schema's own owner and privileges.

Each shard's own schema name, wherever the catalog spells it (``insta17.next_id()`` in a default,
``FROM insta17.photos`` in a view, ``'insta17.next_id_seq'::regclass``), is replaced by
``{schema}.``, so identical shards give identical text. What is legitimately per shard is left
out: the bodies of ``next_id()`` and of the template's other re-deployable functions (``per_shard``:
``name/nargs``; they may hold the shard number, and ``verify``, ``plan`` and ``redeploy`` compare them
with the template) and the trigger a move puts on a shard's old tables. Left out as said twice:
PostgreSQL 18's NOT NULL constraints (the column's row says ``not null``) and the index behind a
primary key, unique or exclusion constraint (the constraint's row names its columns); deparsing them
cost about half the query's time.

Cost: the deparsing functions (``pg_get_expr`` and friends) are most of the query's time, and
deparsing a call of ``next_id()`` looks the name up among every shard's ``next_id()`` (quadratic in
the shards per host), so a default that is exactly a call of the shard's own ``next_id()`` (its node
tree, compared as text) is written as ``{schema}.next_id()`` without deparsing, and any other default
without a column reference (``now()``, the same node tree on every shard) is deparsed once per distinct
node tree, not once per shard. An index without expressions or a predicate is described from
``pg_index`` (access method, columns with their operator classes, options, collations, INCLUDE
columns, storage options, tablespace) instead of ``pg_get_indexdef``: a third of the cost.

``FINGERPRINT_SQL`` folds each shard's rows, in a fixed order, into one md5 on the server (one query
per host for all its shards); ``OBJECTS_SQL`` returns the rows themselves for the few shards whose
digest differs, so the difference can be named object by object (``differences``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager

import psycopg
from psycopg import sql

from ..errors import ShardctlError
from ..model.ranges import format_shards, parse_shards
from ..model.topology import Topology
from . import queries
from .catalog import ledger as ledger_q
from .catalog.control import REPEATABLE_READ, catalog_token
from .session import COMMIT

# a second connection to the same database, from the caller (this layer opens none)
Opener = Callable[[], AbstractContextManager[psycopg.Connection]]

# Every object of the schemas asked for, one row each (queries/fingerprint_objects.sql, which
# leaves the guard triggers of a move out: GUARD_TRIGGER); the fingerprint hashes one schema's rows.
OBJECTS_SQL = queries.load("fingerprint_objects")
FINGERPRINT_SQL = f"""SELECT schema, md5(string_agg(concat_ws(' ', kind, tbl, name, def), E'\\n'
                              ORDER BY kind COLLATE "C", tbl COLLATE "C", name COLLATE "C"))
  FROM (
{OBJECTS_SQL}
) AS o GROUP BY schema"""

Key = tuple[str, str, str]  # (kind, tbl, name)
NEXT_ID = ("next_id/0",)


def fingerprints(
    conn: psycopg.Connection, schemas: list[str], per_shard: tuple[str, ...] = NEXT_ID
) -> dict[str, str]:
    """Schema → the md5 of its catalog text, for the ``schemas`` that exist: one query. ``per_shard``:
    functions (``name/nargs``) whose bodies are left out."""
    if not schemas:
        return {}
    with conn.transaction():
        conn.execute(_work_mem(len(schemas)))
        rows = conn.execute(
            FINGERPRINT_SQL, {"schemas": schemas, "per_shard": list(per_shard)}
        ).fetchall()
    return dict(rows)


def _work_mem(schemas: int) -> str:
    """``SET LOCAL work_mem`` for the fingerprint of ``schemas`` shards: at the default 4 MB its sort of
    ~22 rows per shard spills to disk from a few hundred shards on, and the query takes about twice
    as long (2,048 shards: 0.8 s against 0.4 s); 64 MB, and 32 kB more per shard above 2,048."""
    return f"SET LOCAL work_mem = '{max(64 * 1024, schemas * 32)}kB'"


def objects(
    conn: psycopg.Connection, schemas: list[str], per_shard: tuple[str, ...] = NEXT_ID
) -> dict[str, dict[Key, str]]:
    """Schema → (kind, table, name) → definition text, for a few ``schemas``."""
    out: dict[str, dict[Key, str]] = {s: {} for s in schemas}
    rows = conn.execute(OBJECTS_SQL, {"schemas": schemas, "per_shard": list(per_shard)}).fetchall()
    for schema, kind, tbl, name, definition in rows:
        out[schema][(kind, tbl, name)] = definition or ""
    return out


def objects_and_prints(
    conn: psycopg.Connection, schemas: list[str], per_shard: tuple[str, ...] = NEXT_ID
) -> tuple[dict[str, dict[Key, str]], dict[str, str]]:
    """:func:`objects` and :func:`fingerprints` of a few ``schemas`` from one query: the digest is
    computed here as ``FINGERPRINT_SQL`` computes it on the server (each row's non-null fields joined
    by a space, rows in byte order of kind, table and name, joined by newlines, md5), so the two can
    be compared (verify's reference reads every version of its one schema this way)."""
    out: dict[str, dict[Key, str]] = {s: {} for s in schemas}
    lines: dict[str, list[tuple[bytes, bytes, bytes, str]]] = {s: [] for s in schemas}
    rows = conn.execute(OBJECTS_SQL, {"schemas": schemas, "per_shard": list(per_shard)}).fetchall()
    for schema, kind, tbl, name, definition in rows:
        out[schema][(kind, tbl, name)] = definition or ""
        text = " ".join(x for x in (kind, tbl, name, definition) if x is not None)
        lines[schema].append((kind.encode(), tbl.encode(), name.encode(), text))
    prints = {
        s: hashlib.md5("\n".join(t for *_, t in sorted(found)).encode()).hexdigest()
        for s, found in lines.items()
        if found
    }
    return out, prints


def _label(key: Key) -> str:
    kind, tbl, name = key
    if kind == "schema":
        return "the schema itself"
    return f"{kind} {name}" + (f" on {tbl}" if tbl else "")


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def differences(
    reference: dict[Key, str],
    shard: dict[Key, str],
    *,
    limit: int = 160,
    why: Callable[[Key, str], str] | None = None,
) -> list[str]:
    """What ``shard`` has that ``reference`` lacks, lacks, or has otherwise, one line per object (a
    missing or extra table once, not its columns, indexes and constraints too). ``limit`` shortens
    definitions (0: whole); ``why(key, case)`` (case: "missing", "extra" or "differs"), when given,
    is added to each line in parentheses (which migration makes the object)."""
    lost = {k[2] for k in reference.keys() - shard.keys() if k[0] == "table"}
    gained = {k[2] for k in shard.keys() - reference.keys() if k[0] == "table"}
    out = []
    for key in sorted(
        reference.keys() | shard.keys(), key=lambda k: (k[1] or k[2], k[1] != "", k[0], k[2])
    ):
        if key[0] != "table" and key[1] in (lost | gained):
            continue
        if key not in shard:
            case, line = "missing", f"missing {_label(key)}"
        elif key not in reference:
            case, line = "extra", f"extra {_label(key)}"
        elif shard[key] != reference[key]:
            mine, theirs = (
                (shard[key], reference[key])
                if not limit
                else (_short(shard[key], limit), _short(reference[key], limit))
            )
            case, line = "differs", f"{_label(key)} differs: {mine!r} (reference: {theirs!r})"
        else:
            continue
        out.append(line + (f" ({why(key, case)})" if why is not None else ""))
    return out


# shardctl.meta's key for the shards' catalog fingerprints, kept while no DDL commits on the host
PRINTS_KEY = "status_fingerprints"
_PRINTS_TEXT = hashlib.md5(FINGERPRINT_SQL.encode()).hexdigest()


def kept(
    conn: psycopg.Connection,
    topo: Topology,
    shards: set[int],
    per_shard: tuple[str, ...],
    second: Opener | None = None,
    fresh: bool = False,
) -> dict[str, list[int]]:
    """Catalog fingerprint → the ``shards`` that have it (``status``, ``verify``).

    Computing them reads every shard's catalog (about a second at 8,192 shards), so a host whose DDL
    is watched (``catalog_token``: the DDL transactions committed so far) keeps them in its control
    schema, read back while no DDL has committed since: the token and the fingerprints come from one
    snapshot, so a change committed while they are computed is never taken for seen. A host with no
    watch (made by a role that may not create event triggers) computes them every time. ``second``:
    a second connection that computes half of them at once (``_split``). ``fresh``: never read
    them back (``verify --full``: DDL run where the watch does not fire, with
    ``session_replication_role = replica`` or ``event_triggers = off``, is seen too)."""
    conn.execute(REPEATABLE_READ)
    try:
        token = catalog_token(conn)
        key = {"token": token, "query": _PRINTS_TEXT, "per_shard": list(per_shard)}
        cached = ledger_q.read_meta(conn, PRINTS_KEY) if token is not None and not fresh else None
        if isinstance(cached, dict) and cached.get("key") == key:
            found = {fp: parse_shards(spec) for fp, spec in cached["prints"].items()}
            if set().union(*found.values()) >= shards:
                return found
        schema = topo.schema_name
        computed = _split(conn, [schema(n) for n in sorted(shards)], per_shard, second)
    finally:
        conn.execute(COMMIT)
    found = {}
    for n in sorted(shards):
        if schema(n) in computed:
            found.setdefault(computed[schema(n)], []).append(n)
    if token is not None:
        value = {"key": key, "prints": {fp: format_shards(s) for fp, s in found.items()}}
        try:
            with conn.transaction():
                ledger_q.write_meta(conn, PRINTS_KEY, json.dumps(value))
        except psycopg.Error:  # a read-only role or standby: no cache, same answer
            pass
    return found


SPLIT_FROM = 512  # schemas: below, a second connection costs more than half the query saves
# a standby exports none: its half is computed on the one connection
EXPORT_SNAPSHOT = "SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_export_snapshot() END"


def _split(
    conn: psycopg.Connection,
    schemas: list[str],
    per_shard: tuple[str, ...],
    second: Opener | None,
) -> dict[str, str]:
    """:func:`fingerprints` of ``schemas``, with ``conn`` in a transaction; with ``second``, the later
    half on a second connection at the same time, in ``conn``'s snapshot (``pg_export_snapshot``),
    so the result is the one snapshot's as the cache's key requires. The query is one server
    process's CPU (a second of it at 2,048 shards): two processes halve it where the server has the
    cores. A second connection that fails leaves its half to ``conn``."""
    if second is None or len(schemas) < SPLIT_FROM:
        return fingerprints(conn, schemas, per_shard)
    snapshot = conn.execute(EXPORT_SNAPSHOT).fetchone()[0]
    if snapshot is None:
        return fingerprints(conn, schemas, per_shard)
    half = len(schemas) // 2

    def other() -> dict[str, str]:
        with second() as helper:
            helper.execute(REPEATABLE_READ)
            try:
                helper.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(snapshot))
                return fingerprints(helper, schemas[half:], per_shard)
            finally:
                helper.execute(COMMIT)

    with ThreadPoolExecutor(1, thread_name_prefix="fingerprint") as pool:
        later = pool.submit(other)
        found = fingerprints(conn, schemas[:half], per_shard)
        try:
            found.update(later.result())
        except (psycopg.Error, OSError, ShardctlError):  # no second connection: this one does it
            found.update(fingerprints(conn, schemas[half:], per_shard))
    return found
