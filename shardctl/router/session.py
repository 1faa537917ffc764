"""The Router's session protocol: what one call sends, so that nothing carries over on the server.

A call (one :meth:`Router.execute`, :meth:`Router.run` or ``connection()`` block) checks a pooled
connection out, and every transaction it runs starts with the shard's ``search_path`` and the call's
``statement_timeout`` set *for that transaction only* (``set_config(..., true)``), in the same round
trip as the ``BEGIN``. A transaction pooler (PgBouncer, RDS Proxy, Supavisor, pgcat) may give each
transaction another server connection: each one still runs on its own shard, and none leaves a setting
behind for another client.

The states of a checked-out connection, and what moves it:

``idle``  --first statement-->  ``in transaction`` (BEGIN + settings, one round trip, sent by the
Router's cursors; a single-statement call pipelines BEGIN, settings, statement and COMMIT in one)
``in transaction``  --commit()/end of call-->  ``idle`` (the next statement begins again)
end of call  -->  back to the pool: after the reset of session state, where the server keeps sessions
(``hosts[].pooler: none|session``) and the call may have left some.

Prepared statements live in a server session: the Router's statements are prepared only where the
host keeps sessions. Behind a transaction pooler, statements that would leave session state (a
session ``SET``, ``LISTEN``, session advisory locks, temporary tables that outlive the transaction,
``WITH HOLD`` cursors, ``PREPARE``) raise :class:`SessionStateError` before they are sent.

Everything here is pure: it reads a connection's values (``check_statement``, ``opening``,
``outer_block``, ``statement_text``, ``reset_text``) and says what to send, or maps a failure
(:func:`failure`). The sending is the Router's (``_async.py``, and ``_sync.py`` generated from it).
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..engine.connections import first_line
from ..errors import HostUnreachable, SessionStateError
from ..sql import session as session_sql
from .pool import log


@dataclass(frozen=True, slots=True)
class Call:
    """What one Router call asks of the server: its shard, its bounds, and its shape.

    ``kind``: ``"statement"`` (one statement: :meth:`Router.execute`/``read``), ``"run"`` (a
    :meth:`Router.run` work function) or ``"block"`` (a ``connection()`` block, whose statements the
    Router sees only through its cursors: it always resets where sessions are kept).
    """

    schema: str
    timeout: float | None
    kind: str
    readonly: bool = False
    max_lag: float | None = None  # a standby read: the staleness bound, seconds
    # the shard whose redirect each transaction looks for first (Placement.redirect_check)
    checked: int | None = None

    @property
    def tracked(self) -> bool:
        return self.kind != "block"

    def deadline(self, grace: float) -> float | None:
        """The client's deadline (``time.monotonic()``) of a call starting now: ``timeout`` + ``grace``."""
        return None if self.timeout is None else time.monotonic() + self.timeout + grace

    def ready(self, conn: Any, keeps: bool) -> None:
        """Ready a checked-out connection for this call: its first statement begins the call's
        transaction on the shard (``conn.begin``, sent by the Router's cursors)."""
        # Prepared statements only where the server session is ours, and only in run(), which calls its
        # work again when a migration made a plan stale (a block has no retry; execute() binds on the client).
        conn.prepare_threshold = 5 if keeps and self.kind == "run" else None
        conn.session_dirty = False
        conn.begin = session_sql.transaction_start(
            self.schema, ms(self.timeout), self.readonly, self.checked
        )
        conn.one_transaction = self.kind == "run"

    def keeps_after(self, error: str, conn: Any, keeps: bool) -> bool | None:
        """Whether the connection of this call, failed with ``error`` (its stats kind), stays pooled:
        True, False, or None: only if resetting its session succeeds. A cut, broken or interrupted
        connection never does."""
        if error not in _POOLABLE_ERRORS:
            return False
        return True if not keeps or (self.tracked and not conn.session_dirty) else None


_POOLABLE_ERRORS = frozenset({"sql", "stale_plan", "other", "session_state"})


def ms(seconds: float | None) -> int:
    """statement_timeout in ms (0: none)."""
    return 0 if seconds is None else max(1, int(seconds * 1000))


def opening(conn: Any) -> list[bytes]:
    """What opens the call's transaction on ``conn`` (a Router connection, sync or async): nothing when
    outside a call or in a transaction; else BEGIN and the settings, as one text (the simple protocol) or
    two (in a pipeline, the extended protocol: still one round trip)."""
    if conn.begin is None or conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return []
    begin, settings = conn.begin
    if conn._pipeline is not None:
        return [begin, settings]
    return [session_sql.then(begin, settings)]


def opened_statement(conn: Any, query: Any, has_params: bool) -> bytes | None:
    """``query`` behind the call's BEGIN and settings, as one simple-protocol text, when it opens the
    call's transaction (outside a pipeline); else None. With parameters, the opening's ``%`` are escaped
    for the client-side binding."""
    if conn._pipeline is not None:
        return None
    texts = opening(conn)
    if not texts:
        return None
    (start,) = texts
    return session_sql.then(
        start.replace(b"%", b"%%") if has_params else start, _query_bytes(conn, query)
    )


def skip_opening(cursor: Any) -> None:
    """On a cursor that ran :func:`opened_statement`'s text: past the BEGIN's and the settings' results, to
    the statement's own."""
    cursor.nextset()
    cursor.nextset()


def outer_block(conn: Any) -> str:
    """What ``conn.transaction()`` is in a call: ``"psycopg"`` (psycopg's own block: outside a call or
    inside a transaction), ``"savepoint"`` (run(): the whole call is one transaction, opened first) or
    ``"outer"`` (the block is the transaction: BEGIN with the settings ... COMMIT)."""
    if conn.begin is None or conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return "psycopg"
    return "savepoint" if conn.one_transaction else "outer"


def statement_text(conn: Any, query: Any) -> bytes:
    """run_statement()'s text: BEGIN, settings, the statement and COMMIT (after the session-state check)."""
    begin, settings = conn.begin
    text = _query_bytes(conn, query)
    conn.begin = None  # the BEGIN is the text's own
    check_statement(conn, text)  # the session-state check and the reset flag
    return session_sql.one_statement(begin, settings, text)


def _query_bytes(conn: Any, query: Any) -> bytes:
    if isinstance(query, sql.Composable):
        query = query.as_bytes(conn)
    return query.encode(conn.info.encoding) if isinstance(query, str) else bytes(query)


def check_statement(conn: Any, query: Any) -> None:
    """Before a statement on a Router connection (sync or async): refuse it when it would leave session
    state behind a transaction pooler; mark the connection for the reset when it may leave some."""
    text = _text(query)
    if text is None or not _text_leaves_no_state(text):
        if not conn.keeps_sessions and text is not None:
            what = session_statement(text)
            if what:
                raise SessionStateError(_refusal(what))
        conn.session_dirty = True


def check_server_cursor(conn: Any, withhold: bool) -> None:
    """Before a named cursor's statement: WITH HOLD refused behind a transaction pooler; always a reset."""
    if withhold and not conn.keeps_sessions:
        raise SessionStateError(_refusal("a WITH HOLD cursor"))
    conn.session_dirty = True


def _refusal(what: str) -> str:
    return (
        f"{what} would outlive the transaction on a server connection that the host's transaction pooler gives "
        f"to other clients (hosts[].pooler: transaction, the default); keep state in the transaction (SET LOCAL, "
        f"set_config(..., true), pg_advisory_xact_lock, ON COMMIT DROP), or set the host's pooler to "
        f"'session' or 'none' when its dsn keeps sessions"
    )


def _text(query: Any) -> str | None:
    if isinstance(query, bytes):
        return query.decode("utf-8", "replace")
    if isinstance(query, str):
        return query
    return None  # sql.Composed and friends: not worth rendering here; reset to be safe


_STARTS_CLEAN = re.compile(
    r"\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*(insert|update|delete|select|with|values|table|merge)\b",
    re.IGNORECASE | re.DOTALL,
)
# Words with which a query can leave session state behind (settings, temp tables, advisory locks,
# LISTEN, cursors, prepared statements, roles). A false alarm only costs the reset round trip.
_SESSION_WORDS = re.compile(
    r"set_config|advisory|temp|listen|prepare|declare|role|authorization|setseed|dblink|"
    r"\bset\s+(?:session|local)\b",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=2048)
def _text_leaves_no_state(text: str) -> bool:
    return bool(_STARTS_CLEAN.match(text)) and not _SESSION_WORDS.search(text)


# Statements that certainly leave session state (refused behind a transaction pooler). Each pattern is
# matched after leading comments and white space; the first group names what it is.
_LEAD = r"^\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*"
_CERTAIN = [
    (
        re.compile(
            _LEAD + r"(?:set\s+(?:session\s+)?(?!local\b|transaction\b|constraints\b)\w|reset\b)",
            re.IGNORECASE | re.DOTALL,
        ),
        "a session SET or RESET",
    ),
    (re.compile(_LEAD + r"(?:listen|unlisten)\b", re.IGNORECASE | re.DOTALL), "LISTEN"),
    (
        re.compile(
            _LEAD + r"(?:prepare|deallocate)\b(?!\s+transaction)", re.IGNORECASE | re.DOTALL
        ),
        "a PREPAREd statement",
    ),
    (
        re.compile(_LEAD + r"declare\b[^;]*\bwith\s+hold\b", re.IGNORECASE | re.DOTALL),
        "a WITH HOLD cursor",
    ),
    (
        re.compile(
            _LEAD + r"create\s+(?:(?:global|local)\s+)?temp(?:orary)?\s+(?:table|view|sequence)\b"
            r"(?![^;]*\bon\s+commit\s+drop\b)",
            re.IGNORECASE | re.DOTALL,
        ),
        "a temporary table or view",
    ),
    (
        re.compile(r"\bpg_(?:try_)?advisory_(?:un)?lock(?:_shared)?\s*\(", re.IGNORECASE),
        "a session advisory lock",
    ),
    (
        re.compile(r"\bset_config\s*\((?:[^()]|\([^()]*\))*,\s*false\s*\)", re.IGNORECASE),
        "set_config(..., false)",
    ),
]


@functools.lru_cache(maxsize=2048)
def session_statement(text: str) -> str | None:
    """What session state ``text`` certainly leaves (for the refusal), or None."""
    for pattern, what in _CERTAIN:
        if pattern.search(text):
            return what
    return None


def reset_text(conn: Any, commit: bool) -> tuple[bool, str]:
    """The reset for ``conn`` (sync or async): (roll back first, the reset's text: the COMMIT in front
    when ``commit`` and a transaction is open). Its first result set (after the COMMIT's) names the
    user's prepared statements, each dropped with :func:`deallocate_text`."""
    status = conn.pgconn.transaction_status
    if commit and status in (
        psycopg.pq.TransactionStatus.INTRANS,
        psycopg.pq.TransactionStatus.INERROR,
    ):
        return False, session_sql.COMMIT_THEN_RESET
    return status != psycopg.pq.TransactionStatus.IDLE, session_sql.RESET


def deallocate_text(name: str) -> str:
    return session_sql.deallocate(name)


def forget_prepared_text(epoch: int) -> str:
    """What drops the session's prepared statements, on the server and in psycopg's cache.

    psycopg clears its cache when a statement's tag is DEALLOCATE ALL, but only the first time it
    sees that query text on a connection (psycopg 3.3: a text it has counted before skips the
    check), so each epoch sends its own text; a repeated text left psycopg executing
    statements the server had dropped ("prepared statement _pg3_1 does not exist").
    """
    return session_sql.deallocate_all(epoch)


def stale_plan(exc: BaseException) -> bool:
    return getattr(
        exc, "sqlstate", None
    ) == "0A000" and "cached plan must not change result type" in str(exc)


class Fallback(Exception):
    """The standby cannot serve this read (args[0]: ``lagging`` or ``unreachable``): use the primary."""


def unreachable(pool: Any, started: float, call: Call) -> None:
    """Count a call whose host is unreachable; a standby read falls back to the primary."""
    pool.record(time.perf_counter() - started, "unreachable")
    if call.max_lag is not None:
        raise Fallback("unreachable") from None


def failure(
    pool: Any, slot: Any, exc: BaseException, fired: bool, timeout: float | None, grace: float
) -> tuple[str, BaseException]:
    """What a failed call was (its stats kind), and what its caller sees: a cut (the deadline fired)
    or a broken connection becomes HostUnreachable (the breaker opens on a cut); other errors pass."""
    if fired:
        cause = f"no answer within {timeout + grace:g}s (timeout {timeout:g}s)"  # type: ignore[operator]
        pool.breaker.failure(cause, probe_now=True)
        pool.drop_idle()
        return "timeout", HostUnreachable(pool.breaker.name, cause)
    conn = slot.conn
    if isinstance(exc, psycopg.OperationalError) and (
        conn.closed or conn.pgconn.status != psycopg.pq.ConnStatus.OK
    ):
        log.info("host %s: connection lost: %s", pool.breaker.name, first_line(exc))
        return "connection_lost", HostUnreachable(pool.breaker.name, first_line(exc))
    if stale_plan(exc):
        # every pooled connection drops its prepared statements before its next use
        pool.plan_epoch += 1
        return "stale_plan", exc
    if isinstance(exc, SessionStateError):
        return "session_state", exc
    if isinstance(exc, psycopg.Error):
        return "sql", exc
    return ("other" if isinstance(exc, Exception) else "interrupted"), exc
