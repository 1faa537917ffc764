"""The one place that decides what an SQL identifier may be and how it is quoted.

Quoting here needs no connection and no psycopg (the offline commands render SQL without it); the
output is the same text as ``psycopg.sql.Identifier``/``Literal`` give without a connection.
"""

from __future__ import annotations

import math
import re

MAX_IDENTIFIER_BYTES = 63
# \Z, not $: "$" would also match before a trailing newline.
_SAFE = re.compile(r"[a-z_][a-z0-9_]*\Z")

# PostgreSQL's reserved key words (Appendix C, "reserved" and "reserved (can be
# function or type)"): an unquoted schema may not be named after one.
RESERVED = frozenset(
    [
        "all",
        "analyse",
        "analyze",
        "and",
        "any",
        "array",
        "as",
        "asc",
        "asymmetric",
        "authorization",
        "binary",
        "both",
        "case",
        "cast",
        "check",
        "collate",
        "collation",
        "column",
        "concurrently",
        "constraint",
        "create",
        "cross",
        "current_catalog",
        "current_date",
        "current_role",
        "current_schema",
        "current_time",
        "current_timestamp",
        "current_user",
        "default",
        "deferrable",
        "desc",
        "distinct",
        "do",
        "else",
        "end",
        "except",
        "false",
        "fetch",
        "for",
        "foreign",
        "freeze",
        "from",
        "full",
        "grant",
        "group",
        "having",
        "ilike",
        "in",
        "initially",
        "inner",
        "intersect",
        "into",
        "is",
        "isnull",
        "join",
        "lateral",
        "leading",
        "left",
        "like",
        "limit",
        "localtime",
        "localtimestamp",
        "natural",
        "not",
        "notnull",
        "null",
        "offset",
        "on",
        "only",
        "or",
        "order",
        "outer",
        "overlaps",
        "placing",
        "primary",
        "references",
        "returning",
        "right",
        "select",
        "session_user",
        "similar",
        "some",
        "symmetric",
        "system_user",
        "table",
        "tablesample",
        "then",
        "to",
        "trailing",
        "true",
        "union",
        "unique",
        "user",
        "using",
        "variadic",
        "verbose",
        "when",
        "where",
        "window",
        "with",
    ]
)

# Schemas shardctl or PostgreSQL own; a shard schema must not take one of these names.
TAKEN = frozenset({"public", "information_schema", "shardctl"})


def identifier_problem(name: str) -> str | None:
    """Why ``name`` is not a safe unquoted identifier, or None when it is."""
    if not name:
        return "is empty"
    if len(name.encode()) > MAX_IDENTIFIER_BYTES:
        return (
            f"is {len(name.encode())} bytes long (PostgreSQL keeps at most {MAX_IDENTIFIER_BYTES})"
        )
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
    """An identifier for SQL text: as is when it is a safe unquoted name, else double-quoted.

    Raises ValueError for an empty name (``""`` is not an identifier in any form).
    """
    # identifier_problem first: a template's undefined name raises its own error there, naming it.
    if identifier_problem(name) is None:
        return name
    if not isinstance(name, str):
        raise TypeError(f"an SQL identifier must be a string, got {type(name).__name__}")
    if not name:
        raise ValueError("an empty name cannot be an SQL identifier")
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: None | bool | float | str) -> str:
    """An SQL literal for text that is built outside a live connection.

    Strings with a backslash take the E'' form, so the text means the same whatever
    standard_conforming_strings is; negative numbers get a leading blank (``- -1`` is not ``--1``).
    """
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return {"nan": "'NaN'::float8", "inf": "'Infinity'::float8", "-inf": "'-Infinity'::float8"}[
            repr(value)
        ]
    if isinstance(value, (int, float)):
        text = repr(value)
        return " " + text if text.startswith("-") else text
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("PostgreSQL text cannot contain NUL (0x00) characters")
        quoted = value.replace("'", "''")
        if "\\" in value:
            return " E'" + quoted.replace("\\", "\\\\") + "'"
        return "'" + quoted + "'"
    raise TypeError(f"quote_literal: unsupported type {type(value).__name__}")
