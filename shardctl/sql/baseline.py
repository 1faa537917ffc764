"""The baseline migration of an adopted database: its sharded tables' definitions as one Jinja
template, rendered per shard like every other migration (``V0001__baseline.sql``).

Why the catalog and not ``pg_dump``: the definitions come from the server's own renderings
(``format_type``, ``pg_get_expr``, ``pg_get_constraintdef``, ``pg_get_indexdef``, the functions
``pg_dump`` itself prints with), read by ``sql.catalog.adopt`` in the plan's snapshot. So the baseline
needs no ``pg_dump`` binary of the right major on the user's machine (``pg_dump`` refuses a server
newer than itself, and the library's operations cannot reach the sandbox's builds), each object
arrives as a record whose parts the baseline decides on (the ID column's default becomes
``{{ next_id }}()``, its identity or sequence goes; foreign keys to tables that stay unsharded are
never written), and nothing has to be cut out of a dump's text (ownership, grants, ``SET``s,
sequences, the other tables).

The schema's name is replaced on PostgreSQL's own tokens (pglast's scanner), never by text search:
only an identifier token that names the adopted schema and is followed by a ``.`` becomes
``{{ schema|ident }}``; a string literal or a column that happens to read ``public`` is untouched.
Catalog text that holds Jinja markers is kept literal with ``{% raw %}``.
"""

from __future__ import annotations

from collections.abc import Iterable

from pglast import parser as pg_parser

from ..model.identifiers import quote_ident as q
from ..model.identifiers import quote_literal
from .catalog.adopt import Column, Table

SCHEMA = "{{ schema|ident }}"
NEXT_ID = "{{ next_id }}()"
JINJA_MARKERS = ("{{", "{%", "{#")


def _unquoted(token: str) -> str:
    if token.startswith('"'):
        return token[1:-1].replace('""', '"')
    return token.lower()


def in_shard(text: str, schema: str) -> str:
    """``text`` (catalog output, names qualified) with every qualifier naming ``schema`` made the
    shard's, and its Jinja markers kept literal."""
    tokens = list(pg_parser.scan(text))
    out, last = [], 0
    for i, token in enumerate(tokens):
        value = text[token.start : token.end + 1]
        if (
            token.name == "IDENT"
            and _unquoted(value) == schema
            and i + 1 < len(tokens)
            and tokens[i + 1].name == "ASCII_46"
            and (i == 0 or tokens[i - 1].name != "ASCII_46")
        ):
            out += [_literal(text[last : token.start]), SCHEMA]
            last = token.end + 1
    out.append(_literal(text[last:]))
    return "".join(out)


def _literal(text: str) -> str:
    if any(marker in text for marker in JINJA_MARKERS):
        return "{% raw %}" + text + "{% endraw %}"
    return text


def enum_type(name: str, labels: list[str]) -> str:
    values = ", ".join(quote_literal(label) for label in labels)
    return f"CREATE TYPE {SCHEMA}.{q(name)} AS ENUM ({values});\n"


def _column(column: Column, schema: str, id_column: str | None) -> str:
    parts = [q(column.name)]
    if column.name == id_column:
        return f"    {q(column.name)} bigint NOT NULL DEFAULT {NEXT_ID}"
    parts.append(in_shard(column.type, schema))
    if column.collation:
        parts.append(f"COLLATE {in_shard(column.collation, schema)}")
    if column.generated == "s":
        parts.append(f"GENERATED ALWAYS AS ({in_shard(column.default or '', schema)}) STORED")
    elif column.identity:
        parts.append(
            f"GENERATED {'ALWAYS' if column.identity == 'a' else 'BY DEFAULT'} AS IDENTITY"
        )
    elif column.default is not None:
        parts.append(f"DEFAULT {in_shard(column.default, schema)}")
    if column.not_null:
        parts.append("NOT NULL")
    return "    " + " ".join(parts)


def create_table(table: Table, schema: str, id_column: str | None) -> str:
    """``CREATE TABLE`` with its columns and its constraints but foreign keys, then its replica
    identity when it is not the default."""
    lines = [_column(c, schema, id_column) for c in table.columns]
    lines += [
        f"    CONSTRAINT {q(k.name)} {in_shard(k.definition, schema)}"
        for k in table.constraints
        if k.kind != "f"
    ]
    text = f"CREATE TABLE {SCHEMA}.{q(table.name)} (\n" + ",\n".join(lines) + "\n);\n"
    if table.replica_identity == "f":
        text += f"ALTER TABLE {SCHEMA}.{q(table.name)} REPLICA IDENTITY FULL;\n"
    return text


def foreign_keys(table: Table, schema: str, keep: Iterable[str]) -> str:
    """The table's foreign keys to the tables in ``keep`` (the other sharded ones)."""
    kept = set(keep)
    return "".join(
        f"ALTER TABLE {SCHEMA}.{q(table.name)} ADD CONSTRAINT {q(k.name)} "
        f"{in_shard(k.definition, schema)};\n"
        for k in table.constraints
        if k.kind == "f" and k.ref_schema == schema and k.ref_table in kept
    )


def indexes(table: Table, schema: str) -> str:
    return "".join(f"{in_shard(i.definition, schema)};\n" for i in table.indexes)


def header(lines: list[str]) -> str:
    return "".join(f"-- {line}\n" for line in lines)
