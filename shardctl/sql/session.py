"""The session and transaction texts every layer sends: BEGIN/COMMIT, savepoints, settings for a
transaction or a session (``set_config``), the search path, isolation levels, the Router's transaction
opening and session reset, and the prepared-statement clean-up. The protocols that decide *when* each
is sent stay with their callers (``router/session.py``, ``engine/executor.py``, ``ops/move``)."""

from __future__ import annotations

import functools
from typing import Any

import psycopg
from psycopg import sql

from ..model.identifiers import quote_ident, quote_literal

BEGIN = "BEGIN"
COMMIT = "COMMIT"
REPEATABLE_READ = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"
REPEATABLE_READ_ONLY = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
# a server that answers is up; a REPEATABLE READ transaction takes its snapshot here
PING = "SELECT 1"
BACKEND_PID = "SELECT pg_backend_pid()"
SERVER_VERSION = "SHOW server_version"

# One shard's statements in a batch of shards: each in a savepoint, so one failing is rolled back alone.
SAVEPOINT = "SAVEPOINT shard;\n"
RELEASE = "RELEASE SAVEPOINT shard;"
UNDO_SAVEPOINT = "ROLLBACK TO SAVEPOINT shard; RELEASE SAVEPOINT shard"


def search_path(schema: str) -> str:
    """The search path of a shard's statements: its schema, then public (as a setting's value)."""
    return f"{quote_ident(schema)}, public"


def duration(seconds: float | None) -> str:
    """A timeout setting's value (``lock_timeout``, ``statement_timeout``…) for ``seconds``: whole
    milliseconds, at least 1 for any positive time; ``"0"`` (no limit) for None or 0. Every layer
    takes its timeouts in seconds; this is the one place they become what PostgreSQL reads."""
    if not seconds or seconds <= 0:
        return "0"
    return f"{max(1, round(seconds * 1000))}ms"


def settings_text(settings: dict[str, str], local: bool = True) -> str:
    """``SELECT set_config(…)`` of each setting, values inlined as literals (for a script of several
    statements): for the transaction (``local``) or the session."""
    scope = "true" if local else "false"
    return "SELECT " + ", ".join(
        f"set_config({quote_literal(name)}, {quote_literal(str(value))}, {scope})"
        for name, value in settings.items()
    )


def set_settings(conn: Any, settings: dict[str, str], local: bool = True) -> None:
    """Set each setting on ``conn`` in one statement, values bound as parameters: for the transaction
    (``local``) or the session."""
    scope = "true" if local else "false"
    conn.execute(
        "SELECT " + ", ".join(f"set_config(%s, %s, {scope})" for _ in settings),
        [x for name, value in settings.items() for x in (name, str(value))],
    )


def set_search_path(schema: str) -> str:
    """A session's search path for one statement outside a transaction (undone by :data:`RESET_PATH`)."""
    return f"SET search_path TO {search_path(schema)}"


RESET_PATH = "RESET search_path"
RESET_PATH_AND_LOCKS = "RESET search_path; RESET lock_timeout"


def text_round_trips(conn: psycopg.Connection, value: str) -> None:
    """Raise psycopg's error when ``value`` cannot be sent in the database's encoding (the client
    encoding is UTF8: the server converts)."""
    conn.execute("SELECT %s::text IS NULL", (value,))


def deadlock_timeout(conn: psycopg.Connection) -> float:
    """The server's ``deadlock_timeout`` in seconds (as this session has it)."""
    return float(
        conn.execute(
            "SELECT setting::float8 / 1000 FROM pg_settings WHERE name = 'deadlock_timeout'"
        ).fetchone()[0]
    )


# ---- the Router's transactions (router/session.py) ---------------------------------------------

_ROUTER_SETTINGS = sql.SQL(
    "SELECT set_config('search_path', {}, true), set_config('statement_timeout', {}, true){}"
)

# Until an adoption's cleanup, what sent a Router to a fleet host (its file saying fleet, or the
# old database's redirect) may be stale: the adoption aborted since (the fleet host recorded a
# redirect per shard back to the old database) and a new copy may be refilling the shard's tables
# under their names. So each of its transactions there first looks for the shard's redirect (the control schema's
# shardctl.redirect_check: one primary-key probe) and, when there is one, fails with SCM01 before
# any statement of the app runs: the Router then asks the host and follows the redirect, as it does
# from a moved shard's stub.
_REDIRECT_CHECK = sql.SQL(", shardctl.redirect_check({})")


def redirect_check(shard: int | None) -> sql.Composable:
    """The settings' column that fails with SCM01 when the host records a redirect for ``shard``
    (nothing for None: no check)."""
    if shard is None:
        return sql.SQL("")
    return _REDIRECT_CHECK.format(sql.Literal(int(shard)))


# Every Router and ORM transaction starts with one of these: composing it costs ~50 µs, a lookup
# next to nothing (bench/orm.py). Bounded: a shard, a timeout and a mode per entry.
@functools.lru_cache(maxsize=16384)
def transaction_start(
    schema: str, timeout_ms: int, readonly: bool, checked: int | None = None
) -> tuple[bytes, bytes]:
    """(BEGIN, the transaction's settings) as texts: values inlined as literals, never prepared.
    ``checked``: the shard whose redirect the settings look for first (``redirect_check``)."""
    begin = b"BEGIN READ ONLY" if readonly else b"BEGIN"
    settings = _ROUTER_SETTINGS.format(
        sql.Literal(search_path(schema)), sql.Literal(str(timeout_ms)), redirect_check(checked)
    )
    return begin, settings.as_string(None).encode()


def one_statement(begin: bytes, settings: bytes, text: bytes) -> bytes:
    """A statement in its own transaction, as one simple-protocol text: BEGIN, settings, it, COMMIT."""
    return then(then(then(begin, settings), text), b"COMMIT")


def then(first: bytes, text: bytes) -> bytes:
    """Two statements as one simple-protocol text."""
    return first + b"; " + text


def switch_search_path(schema: str, checked: int | None = None) -> str:
    """The statement that moves an open transaction to ``schema`` (for SQLAlchemy's sessions),
    looking for ``checked``'s redirect first (``redirect_check``)."""
    return (
        sql.SQL("SELECT set_config('search_path', {}, true){}")
        .format(sql.Literal(f'"{schema}", public'), redirect_check(checked))
        .as_string(None)
    )


def set_local_search_path(schema: str | None, checked: int | None = None) -> str:
    """``SET LOCAL search_path`` to ``schema`` (None: the default path), to the end of the transaction
    (Django's backend: a utility statement, about half the server time of ``set_config``); with
    ``checked``, a ``set_config`` that looks for that shard's redirect first (``redirect_check``)."""
    if checked is not None:
        return switch_search_path(schema or "public", checked)
    path = search_path(schema) if schema else '"$user", public'
    return f"SET LOCAL search_path = {path}"


BEGIN_SCRIPT = "BEGIN; "  # in front of a script that opens its own transaction

# What ``DISCARD ALL`` does, less ``DEALLOCATE ALL`` (psycopg keeps its own prepared statements
# and, after the first time, would not notice them gone), and allowed in a transaction. Its first
# result names the user's prepared statements, each dropped with :func:`deallocate`.
RESET = (
    "SELECT coalesce(array_agg(name::text), '{}') FROM pg_prepared_statements WHERE name !~ '^_pg3_';"
    "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; "
    "SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES"
)
COMMIT_THEN_RESET = "COMMIT; " + RESET


def deallocate(name: str) -> str:
    return f"DEALLOCATE {quote_ident(name)}"


def deallocate_all(epoch: int) -> str:
    """DEALLOCATE ALL with the plan epoch in a comment: each epoch's text is new to psycopg's cache."""
    return f"DEALLOCATE ALL /* plan epoch {int(epoch)} */"
