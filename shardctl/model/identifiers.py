"""The one place that decides what an SQL identifier may be and how it is quoted."""

from __future__ import annotations

import re

from psycopg import sql

MAX_IDENTIFIER_BYTES = 63
# \Z, not $: "$" would also match before a trailing newline.
_SAFE = re.compile(r"[a-z_][a-z0-9_]*\Z")

# PostgreSQL's reserved key words (Appendix C, "reserved" and "reserved (can be
# function or type)"): an unquoted schema may not be named after one.
RESERVED = frozenset("""
all analyse analyze and any array as asc asymmetric authorization binary both case cast check
collate collation column concurrently constraint create cross current_catalog current_date
current_role current_schema current_time current_timestamp current_user default deferrable desc
distinct do else end except false fetch for foreign freeze from full grant group having ilike in
initially inner intersect into is isnull join lateral leading left like limit localtime
localtimestamp natural not notnull null offset on only or order outer overlaps placing primary
references returning right select session_user similar some symmetric system_user table tablesample
then to trailing true union unique user using variadic verbose when where window with
""".split())

# Schemas shardctl or PostgreSQL own; a shard schema must not take one of these names.
TAKEN = frozenset({"public", "information_schema", "shardctl"})


def identifier_problem(name: str) -> str | None:
    """Why ``name`` is not a safe unquoted identifier, or None when it is."""
    if not name:
        return "is empty"
    if len(name.encode()) > MAX_IDENTIFIER_BYTES:
        return f"is {len(name.encode())} bytes long (PostgreSQL keeps at most {MAX_IDENTIFIER_BYTES})"
    if not _SAFE.match(name):
        return "must be lower-case letters, digits and underscores, not starting with a digit"
    if name in RESERVED:
        return "is a reserved SQL key word"
    if name.startswith("pg_"):
        return "starts with pg_, which PostgreSQL reserves for system schemas"
    if name in TAKEN:
        return "is a schema PostgreSQL or shardctl already uses"
    return None


def quote_ident(name: str) -> str:
    """An identifier for SQL text: as is when it is a safe unquoted name, else double-quoted."""
    if identifier_problem(name) is None:
        return name
    return sql.Identifier(name).as_string(None)


def quote_literal(value: object) -> str:
    """An SQL literal for text that is built outside a live connection."""
    return sql.Literal(value).as_string(None)
