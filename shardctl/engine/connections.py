"""Connections to fleet hosts: timeouts, masked errors, and the per-host shardctl lock."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from ..errors import BadInput, HostUnreachable, LockBusy
from ..model.dsn import mask
from ..model.topology import Host
from ..sql import locks, session
from .defaults import DEFAULT_CONNECT_TIMEOUT

APPLICATION_NAME = "shardctl"
# pg_advisory_lock(classid, objid): 'SC' and 1 = "changing shards on this host" (init, migrate, add-shard, moves).
LOCK_CLASS = 0x5343
LOCK_FLEET = 1
# Past a lock's deadline, how much longer to wait for a holder that turns out to be gone or exiting
# (a closed connection's backend holds its locks until it has exited).
EXIT_GRACE = 2.0
RELEASE_TIMEOUT = 2.0  # seconds to wait for the server to confirm a release before closing anyway


def connect(
    host: Host,
    *,
    autocommit: bool = False,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    purpose: str = "",
    database: str | None = None,
) -> psycopg.Connection:
    """Open a connection to ``host`` (``database``: another database of its server, e.g. verify's
    scratch one); a host that cannot be reached, or cannot authenticate (its ``password_env`` unset,
    its password refused), raises HostUnreachable with a masked one-line reason that names the fix."""
    env = host.password_env
    if env and os.environ.get(env) is None:
        raise HostUnreachable(
            host.name, f"cannot authenticate: password_env {env} is not set (set {env})"
        )
    # shardctl's own work (DDL, locks, moves) goes over the admin DSN, never through an app pooler.
    kwargs = host.connect_kwargs(
        purpose="admin",
        connect_timeout=max(1, int(connect_timeout)),
        application_name=f"{APPLICATION_NAME} {purpose}".strip(),
        **({"dbname": database} if database else {}),
    )
    try:
        return psycopg.connect(autocommit=autocommit, **kwargs)
    except psycopg.OperationalError as exc:
        raise HostUnreachable(host.name, _connect_failure(host, exc)) from None


# libpq's and the server's words for a login the server refused (no SQLSTATE reaches the client)
_AUTH_FAILURES = (
    "password authentication failed",
    "no password supplied",
    "authentication failed for user",
    "scram authentication",
)


def _connect_failure(host: Host, exc: psycopg.OperationalError) -> str:
    """Why connecting failed, in one line; a refused login says so and names the fix."""
    reason = first_line(exc)
    if not any(words in reason.lower() for words in _AUTH_FAILURES):
        return reason
    detail = " ".join(reason.rsplit("failed: ", 1)[-1].removeprefix("FATAL:").split())
    fix = (
        f"set {host.password_env} to the role's password"
        if host.password_env
        else f"give host {host.name} a password_env naming the variable that holds its password"
    )
    return f"cannot authenticate: {detail} ({fix})"


def first_line(exc: BaseException) -> str:
    """A one-line, password-free version of a database error."""
    text = mask(str(exc)).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    # libpq prefixes "connection failed: connection to server at ... failed:"; keep the reason.
    return lines[0] if len(lines) == 1 else "; ".join(lines[:2])


def set_timeouts(
    conn: psycopg.Connection,
    lock_timeout: float | None = None,
    statement_timeout: float | None = None,
) -> None:
    """Set the session's lock and statement timeouts (seconds; None leaves the setting as it is)."""
    settings = {"lock_timeout": lock_timeout, "statement_timeout": statement_timeout}
    settings = {name: session.duration(v) for name, v in settings.items() if v is not None}
    if settings:
        session.set_settings(conn, settings, local=False)
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.commit()


_DIRECT: set[str] = set()  # admin DSNs this process has found direct (the check runs once per DSN)


def require_direct(
    host: Host, conn: psycopg.Connection, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
) -> None:
    """Refuse (BadInput) when ``conn`` (on the host's admin DSN) goes through a transaction pooler.

    Session advisory locks, DDL with ``CONCURRENTLY`` and logical replication need the same server
    session from one transaction to the next. Two connections prove it: while the first holds a
    transaction open, the second asks for its backend; then each asks again in a new transaction. A
    server gives each connection its own backend for good; a transaction pooler gives the second one
    the first one's backend at once (a pool of one), or another backend the next time.
    """
    dsn = host.dsn_for("admin")
    if dsn in _DIRECT:
        return
    other = connect(host, autocommit=True, connect_timeout=connect_timeout, purpose="direct check")
    try:
        try:
            conn.execute(session.BEGIN)
            first = conn.execute(session.BACKEND_PID).fetchone()[0]
            # waits for a server connection behind a pooler
            other.pgconn.send_query(session.BACKEND_PID.encode())
            conn.execute(session.COMMIT)
            second = _pid_of_sent(other)
            switched = (
                conn.execute(session.BACKEND_PID).fetchone()[0] != first
                or other.execute(session.BACKEND_PID).fetchone()[0] != second
            )
        except psycopg.Error as exc:  # a statement pooler refuses BEGIN
            raise BadInput(
                f"host {host.name}: admin_dsn {mask(dsn)} does not keep a transaction on one server "
                f"connection ({first_line(exc)}); shardctl needs a direct connection there"
            ) from None
    finally:
        other.close()
    if switched or first == second:
        raise BadInput(
            f"host {host.name}: admin_dsn {mask(dsn)} goes through a transaction pooler (the server "
            f"backend changed between transactions on one connection); shardctl's locks, DDL and moves "
            f"need a direct connection: point hosts[].admin_dsn at the server itself"
        )
    _DIRECT.add(dsn)


def _pid_of_sent(conn: psycopg.Connection) -> int:
    result, pid = conn.pgconn.get_result(), None
    while result is not None:
        if result.status == psycopg.pq.ExecStatus.TUPLES_OK:
            pid = int(result.get_value(0, 0).decode())
        elif result.status == psycopg.pq.ExecStatus.FATAL_ERROR:
            raise psycopg.OperationalError(result.error_message.decode(errors="replace"))
        result = conn.pgconn.get_result()
    if pid is None:
        raise psycopg.OperationalError("no answer to SELECT pg_backend_pid()")
    return pid


def _acquire(
    host: Host, deadline: float, wait: float, connect_timeout: int, purpose: str
) -> psycopg.Connection:
    """A connection holding the host's shardctl lock, or LockBusy naming the holder after ``deadline``.
    Refuses an admin DSN that goes through a transaction pooler (:func:`require_direct`) first."""
    conn = connect(
        host, autocommit=True, connect_timeout=connect_timeout, purpose=f"{purpose} lock"
    )
    try:
        require_direct(host, conn, connect_timeout)
        holder = take_locks(conn, LOCK_CLASS, [LOCK_FLEET], deadline)
        if holder is not None:
            raise LockBusy(
                f"host {host.name}: another shardctl run holds the lock ({holder}); "
                f"waited {wait:g}s (use --wait to wait longer)"
            )
        return conn
    except BaseException:
        conn.close()
        raise


def take_locks(
    conn: psycopg.Connection, lock_class: int, keys: list[int], deadline: float
) -> str | None:
    """Take the session advisory locks (lock_class, key) of all ``keys`` on ``conn`` (a connection for
    these locks only), trying until ``deadline``. None once taken, else who holds them. Past the
    deadline a holder that is gone (the lock came free between the try and the look) or exiting is
    waited for up to EXIT_GRACE more: the previous run's backend may still be on its way out."""
    while True:
        if locks.try_advisory_locks(conn, lock_class, keys):
            return None
        now = time.monotonic()
        if now >= deadline:
            holder = locks.advisory_lock_holder(conn, lock_class, keys)
            if (holder is None or holder.exiting) and now < deadline + EXIT_GRACE:
                time.sleep(0.02)
                continue
            return holder.describe() if holder else "holder unknown"
        time.sleep(min(0.2, deadline - now))


def close_releasing(conn: psycopg.Connection, timeout: float = RELEASE_TIMEOUT) -> None:
    """Release the session's advisory locks, then close ``conn``. Closing alone returns before the server
    has ended the session: its backend keeps the locks until it exits, and the next command (``shardctl
    init && shardctl migrate``) could find them held. A server that does not answer within ``timeout``
    (a dead network) is not waited for: closing is all that is left to do then."""
    status = psycopg.pq.TransactionStatus
    try:
        # A connection still busy with a statement (interrupted) cannot take another one: just close it.
        if (
            not conn.closed
            and not conn.broken
            and conn.info.transaction_status in (status.IDLE, status.INTRANS, status.INERROR)
        ):
            if conn.info.transaction_status != status.IDLE:
                conn.rollback()
            _send_and_wait(conn.pgconn, locks.RELEASE_ALL, timeout)
    except (psycopg.Error, OSError):
        pass  # the session is gone or going: its backend releases the locks as it exits
    finally:
        conn.close()


def _send_and_wait(pgconn: psycopg.pq.abc.PGconn, query: str, timeout: float) -> None:
    """Send ``query`` and wait up to ``timeout`` seconds for its results (libpq calls, so the wait is bounded)."""
    deadline = time.monotonic() + timeout
    pgconn.send_query(query.encode())
    while pgconn.flush():  # the query's bytes not all sent yet
        if not select.select([], [pgconn.socket], [], max(0.0, deadline - time.monotonic()))[1]:
            return
    while True:
        pgconn.consume_input()
        if not pgconn.is_busy():
            break
        if not select.select([pgconn.socket], [], [], max(0.0, deadline - time.monotonic()))[0]:
            return
    while pgconn.get_result() is not None:
        pass


@contextmanager
def host_lock(
    host: Host,
    *,
    wait: float = 0,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    purpose: str = "",
) -> Iterator[psycopg.Connection]:
    """Hold the per-host shardctl lock for the block, on a connection of its own.

    The lock is session-level: if this process dies, the server releases it.
    Waits up to ``wait`` seconds, then raises LockBusy naming the holder.
    """
    conn = _acquire(host, time.monotonic() + max(0.0, wait), wait, connect_timeout, purpose)
    try:
        yield conn
    finally:
        close_releasing(conn)


class FleetLocks:
    """The shardctl lock of several hosts, taken one host at a time in name order before any work.

    A fixed order means two runs never each hold a lock the other needs: the second run stops at
    the first host the first run holds, having changed nothing anywhere. An unreachable host is
    remembered (``use`` raises it) so the other hosts still go ahead.
    """

    def __init__(
        self,
        hosts: list[Host],
        *,
        wait: float = 0,
        connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
        purpose: str = "",
    ):
        self.hosts = sorted(hosts, key=lambda h: h.name)
        self.wait = wait
        self.connect_timeout = connect_timeout
        self.purpose = purpose
        self._held: dict[str, psycopg.Connection | HostUnreachable] = {}

    def __enter__(self) -> FleetLocks:
        deadline = time.monotonic() + max(0.0, self.wait)
        try:
            for host in self.hosts:
                try:
                    self._held[host.name] = _acquire(
                        host, deadline, self.wait, self.connect_timeout, self.purpose
                    )
                except HostUnreachable as exc:
                    self._held[host.name] = exc
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        for item in self._held.values():
            if isinstance(item, psycopg.Connection):
                close_releasing(item)
        self._held.clear()

    def refuse_untranslatable(self, texts: list[tuple[str, str]]) -> None:
        """BadInput, before any work, for the first (name, SQL) text a reachable host's database cannot
        hold: a character its encoding lacks (a LATIN1 database and a '€'). The host's own conversion
        decides (a parameter is converted as a statement's text is); SQL_ASCII and UTF8 hold any text
        sent as UTF-8, and every server encoding holds ASCII, so those cost no round trip."""
        wide = [(name, text) for name, text in texts if not text.isascii()]
        for host in self.hosts if wide else []:
            conn = self._held.get(host.name)
            if not isinstance(conn, psycopg.Connection):
                continue  # unreachable: the run reports it
            encoding = conn.info.parameter_status("server_encoding")
            if encoding in ("UTF8", "SQL_ASCII"):
                continue
            for name, text in wide:
                try:
                    session.text_round_trips(conn, text)
                except psycopg.errors.UntranslatableCharacter as exc:
                    raise BadInput(
                        f"{name} cannot run on host {host.name}, whose database is {encoding}: "
                        f"{exc.diag.message_primary or first_line(exc)} (nothing was changed)"
                    ) from None

    @contextmanager
    def use(self, host: Host) -> Iterator[psycopg.Connection]:
        """The lock connection of ``host`` (raises HostUnreachable if it could not be reached)."""
        item = self._held[host.name]
        if isinstance(item, HostUnreachable):
            raise item
        yield item
