"""SQLAlchemy sessions over a :class:`~shardctl.Router`: models routed by shard key and by decoded ID.

Glue in an application::

    from shardctl import Router, Topology
    from shardctl.sqlalchemy import sessionmaker

    Session = sessionmaker(Router(Topology.load("shardctl.yaml")))

    class Photo(Base):                 # a declarative model; no schema= on its table
        __tablename__ = "photos"
        __shard_key__ = "user_id"      # new photos go to the shard of their user_id
        ...

    with Session() as session:
        session.add(Photo(user_id=42, caption="hi")); session.commit()     # id from the shard's next_id()
        session.get(Photo, photo_id)                                        # the shard inside the ID
        session.scalars(select(Photo).where(Photo.user_id == 42))          # the shard of the key
        session.scalars(select(Photo).execution_options(all_shards=True))  # every shard, when asked

How it runs:

* **One connection per host per session transaction.** Each host has one SQLAlchemy Engine whose pool
  checks out nothing of its own: a checkout is a loan of a pooled connection of the Router's
  (:meth:`Router.lend`), and the check-in ends the loan (the Router's pool, breaker, timeouts and stats
  apply). The session's transaction holds one per host it touched, all shards of that host included;
  they go back when it commits, rolls back or closes.
* **The shard per statement.** Each statement names its shard's schema in its text
  (``schema_translate_map={None: "insta5"}``), and the host transaction it opens sets that shard's
  ``search_path`` with ``SET LOCAL`` semantics (``set_config(..., true)``). The BEGIN and the settings
  ride in the text of the transaction's first statement (a lent connection binds parameters on the
  client: :class:`~shardctl.router.RouterClientCursor`), so opening costs no round trip of its
  own. Nothing is prepared and nothing outlives the transaction: safe behind a transaction pooler.
* **Routing.** A model names its shard key (``__shard_key__``: a column routed by the topology's key
  rule; ``__shard_key_is_id__ = True`` when its values are IDs, routed by the shard inside them). Its
  primary key is an ID from the shard's ``next_id()``, so ``get``, refreshes, updates and deletes go to
  the shard inside the ID. A query is routed by ``==`` or ``IN`` on the shard key or the ID in its WHERE
  clause (``OR`` of routable terms: the union), by ``execution_options(shard=N)``, or to every shard
  with ``execution_options(all_shards=True)``; anything else raises :class:`UnroutableStatement`.
* **Moves.** Every session follows a move: a statement that meets a moved shard has the Router follow
  it (the topology file, else the old host's redirect) and gives that host's connection back. The first
  statement of the session's transaction then runs again on the new host, unseen by the caller; a later
  one raises :class:`~shardctl.errors.ShardMoved` (roll back; the next transaction is routed right).
  :meth:`ShardSessionMaker.run` calls its work once more, in a new session, after that.
* **Savepoints** (``begin_nested``) are the host transaction's; after a rollback to one, the next text
  statement sets its shard's ``search_path`` again (ORM statements name their schema).
* **Errors** a session meets on a host are given back with its connection: :meth:`Router.stats` counts them.

A session's transaction over several hosts commits on each host in turn (no two-phase commit).

For asyncio, :mod:`shardctl.sqlalchemy.asyncio` offers the same sessions as SQLAlchemy ``AsyncSession``
objects over an :class:`~shardctl.AsyncRouter` (``async_sessionmaker``).
"""

from __future__ import annotations

import inspect as inspect_module
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import sqlalchemy
from sqlalchemy import event, inspect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import ORMExecuteState, Session
from sqlalchemy.orm import sessionmaker as _sessionmaker
from sqlalchemy.pool import Pool
from sqlalchemy.pool.base import _ConnectionRecord
from sqlalchemy.sql import elements, operators

from ..errors import BadInput, ShardMoved
from ..router import MOVED_ERRORS, SAME, Router
from ..router.placement import GLOBAL
from ..router.session import ms
from ..sql.catalog.control import MOVED_SQLSTATE
from ..sql.session import switch_search_path, transaction_start

T = TypeVar("T")
_await_only = getattr(sqlalchemy.util, "await_", None) or sqlalchemy.util.await_only  # 2.1 / 2.0
_IDLE = psycopg.pq.TransactionStatus.IDLE
# Savepoints belong to the host's transaction, not to a shard; a rollback to one also takes the server's
# search_path back to what it was at the savepoint
_SAVEPOINTS = (
    elements.SavepointClause,
    elements.ReleaseSavepointClause,
    elements.RollbackToSavepointClause,
)
# on a Router connection: its SQLAlchemy pool record, per host pool
_RECORD = "_shardctl_sqla_records"


class UnroutableStatement(BadInput):
    """A statement or object whose shard cannot be told (no shard key, no ID, no shard named)."""


# ---- the binds: one Engine per host, lending the Router's connections ----------------------------------
class _LendingPool(Pool):
    """SQLAlchemy's pool for one host: a checkout borrows a connection from the Router
    (:meth:`Router.lend`), the check-in gives it back. Each Router connection keeps one pool record for
    its life, so the dialect's per-connection setup runs once per server connection, not per loan."""

    def __init__(self, router: Any, host: str, timeout: Any):
        self._router, self._host, self._timeout = router, host, timeout
        self._loans: dict[int, Any] = {}
        self._local = threading.local()
        super().__init__(self._lent_connection, reset_on_return="rollback")

    def _lent_connection(self) -> Any:
        return self._local.conn  # the DBAPI connection is the driver's (psycopg's) own

    def _borrow(self) -> tuple[Any, Any]:
        """A loan of one of the Router's connections: (the loan, its psycopg connection)."""
        loan = self._router.lend(self._host, timeout=self._timeout)
        return loan, loan.__enter__()

    def _give_back(self, loan: Any, error: BaseException | None) -> None:
        loan.__exit__(*_exc_info(error))

    def _do_get(self) -> _ConnectionRecord:
        loan, conn = self._borrow()
        try:
            records = conn.__dict__.setdefault(_RECORD, {})
            record = records.get(id(self))
            if record is None or record.driver_connection is not conn:
                self._local.conn = conn
                try:
                    record = records[id(self)] = _ConnectionRecord(self)
                finally:
                    self._local.conn = None
            conn.shardctl_host = self._router.placement.host_named(self._host)
            conn.__dict__.pop("shardctl_error", None)
        except BaseException as exc:
            self._give_back(loan, exc)
            raise
        self._loans[id(record)] = loan
        return record

    def _do_return_conn(self, record: _ConnectionRecord) -> None:
        loan = self._loans.pop(id(record), None)
        if loan is None:
            return
        conn = record.driver_connection
        # the first error the session met on this loan: the Router counts it in stats() like a call's
        error = None if conn is None else conn.__dict__.pop("shardctl_error", None)
        if conn is not None and not conn.closed and conn.pgconn.transaction_status != _IDLE:
            _wait(conn.rollback())  # nothing commits behind SQLAlchemy's back
        broken = conn is None or conn.closed
        try:
            self._give_back(
                loan,
                psycopg.OperationalError("the connection was closed by SQLAlchemy")
                if broken
                else error,
            )
        except Exception:
            if not broken and error is None:
                raise

    def recreate(self) -> _LendingPool:
        return type(self)(self._router, self._host, self._timeout)

    def dispose(self) -> None:
        """Nothing to close: the connections are the Router's."""

    @property
    def host(self) -> str:
        """The name of the host whose connections it lends."""
        return self._host

    def status(self) -> str:
        return f"shardctl lending pool for host {self._host}: {len(self._loans)} on loan"


def _exc_info(error: BaseException | None) -> tuple[Any, Any, Any]:
    return (None, None, None) if error is None else (type(error), error, error.__traceback__)


def _wait(result: Any) -> Any:
    """``result``, awaited from SQLAlchemy's greenlet when it is awaitable (an asyncio connection's)."""
    return _await_only(result) if inspect_module.isawaitable(result) else result


class Shards:
    """Per Router: an Engine per host, and the execution options that put a statement on a shard."""

    pool_class: type[_LendingPool] = _LendingPool

    def __init__(self, router: Router, *, timeout: float | None = SAME, echo: bool = False):
        self.router = router
        self.timeout = router.options.timeout if timeout is SAME else timeout
        self.echo = echo
        self._engines: dict[str, Engine] = {}
        self._options: dict[tuple[int, str, int | None], dict[str, Any]] = {}
        self._shard_engines: dict[int, tuple[str, Engine]] = {}
        self._lock = threading.Lock()

    def engine(self, host: str) -> Engine:
        """The Engine of host ``host`` (created on first use)."""
        engine = self._engines.get(host)
        if engine is None:
            with self._lock:
                engine = self._engines.get(host)
                if engine is None:
                    engine = self._create_engine(self.pool_class(self.router, host, self.timeout))
                    engine._connection_cls = _ShardConnection
                    event.listen(engine, "before_cursor_execute", _on_shard)
                    event.listen(engine, "handle_error", _on_error)
                    self._engines[host] = engine
        return engine

    def _create_engine(self, pool: _LendingPool) -> Engine:
        return sqlalchemy.create_engine("postgresql+psycopg://", pool=pool, echo=self.echo)

    def host_engine(self, shard: int) -> Engine:
        return self.engine(self.router._locate(shard).name)

    def shard_engine(self, shard: int, host: str) -> Engine:
        """Host ``host``'s Engine with the shard's execution options there (cached per host)."""
        cached = self._shard_engines.get(shard)
        if cached is None or cached[0] != host:
            engine = self.engine(host).execution_options(**self.options(shard, host))
            engine._connection_cls = _ShardConnection
            cached = self._shard_engines[shard] = (host, engine)
        return cached[1]

    def placed(self, shard: int) -> tuple[str, dict[str, Any]]:
        """Where ``shard`` is as of now: its host's name and the execution options running a statement
        there, from one look at the placement. Two looks would race an adoption's flip: the fleet's
        ``insta5`` sent to the old database, or the app's schema to the fleet."""
        host = self.router._locate(shard).name
        return host, self.options(shard, host)

    def options(self, shard: int, host: str) -> dict[str, Any]:
        """Execution options running a statement on ``shard`` in its schema on host ``host``: the
        app's schema on an adopted old database, else the shard's schema."""
        placement = self.router.placement
        on = placement.host_named(host)
        schema, checked = placement.schema_on(on, shard), placement.redirect_check(on, shard)
        opts = self._options.get((shard, schema, checked))
        if opts is None:
            opts = self._options[(shard, schema, checked)] = {
                "schema_translate_map": {None: schema},
                "shardctl_shard": shard,
                "shardctl_begin": transaction_start(schema, ms(self.timeout), False, checked),
                "shardctl_switch": switch_search_path(schema, checked),
            }
        return opts

    def all(self) -> range:
        return range(self.router.topology.shard_count)

    def follow_move(self, exc: BaseException) -> bool:
        """After ``exc`` (raised by a session's statement, the session rolled back): True when its shard
        had moved and the Router now routes it to its new host (try again)."""
        moved = self.moved(exc)
        return moved is not None and self.router.follow_move(*moved)

    def follow(self, exc: BaseException) -> bool:
        """:meth:`follow_move` from a session's statement (awaited there for an asyncio Router)."""
        return bool(_wait(self.follow_move(exc)))

    @staticmethod
    def moved(exc: BaseException) -> tuple[int, BaseException, Any] | None:
        """The Router's ``follow_move`` arguments for ``exc`` (the shard, the driver's error, the host it
        ran on), when a statement met a moved shard; else None."""
        shard, tried = getattr(exc, "shardctl_moved", (None, None))
        orig = getattr(exc, "orig", None)
        return None if shard is None or orig is None else (shard, orig, tried)

    def close(self) -> None:
        for engine in self._engines.values():
            engine.dispose()


def _on_shard(
    conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
) -> None:
    """Before each statement: a transaction it opens starts on its shard; a text statement moving to
    another shard of the host mid-transaction switches ``search_path`` (for that transaction only)."""
    opts = context.execution_options
    begin = opts.get("shardctl_begin")
    raw = conn.connection.driver_connection  # psycopg's (Async)Connection, lent by the Router
    idle = raw.pgconn.transaction_status == _IDLE
    # statements sent in this host transaction: a move is followed by running the first one again
    raw.shardctl_sent = 1 if idle else getattr(raw, "shardctl_sent", 0) + 1
    if begin is None:
        compiled = context.compiled
        if compiled is None or not isinstance(compiled.statement, _SAVEPOINTS):
            raise UnroutableStatement(
                f"no shard for {statement[:80]!r}: run it with execution_options(shard=N)"
            )
        # SAVEPOINT, RELEASE, ROLLBACK TO: the host transaction's (opened, if need be, with the loan's
        # settings). After them the server's search_path is not known here: the next text statement sets
        # its shard's again (ORM statements name their schema).
        if idle or isinstance(compiled.statement, elements.RollbackToSavepointClause):
            raw.shardctl_shard = None
        return
    shard = opts["shardctl_shard"]
    if idle:
        raw.begin = begin
        raw.shardctl_shard = shard
    elif getattr(raw, "shardctl_shard", None) != shard:
        compiled = context.compiled
        if compiled is None or isinstance(compiled.statement, elements.TextClause):
            plain = (
                psycopg.AsyncCursor if isinstance(raw, psycopg.AsyncConnection) else psycopg.Cursor
            )
            _wait(plain(raw).execute(opts["shardctl_switch"]))
            raw.shardctl_shard = shard


def _on_error(ctx: Any) -> None:
    """A statement failed: the loan keeps its first error (for the Router's stats), and an error of a moved
    shard is marked with the shard, the host it ran on and whether it opened that host's transaction (for
    :meth:`ShardSession._followed`)."""
    exc, context = ctx.original_exception, ctx.execution_context
    conn = getattr(ctx.connection, "connection", None) if ctx.connection is not None else None
    raw = getattr(conn, "driver_connection", None)
    if raw is None:
        return
    if isinstance(exc, psycopg.Error):
        raw.__dict__.setdefault("shardctl_error", exc)
    if (
        getattr(exc, "sqlstate", None) not in MOVED_ERRORS
        or context is None
        or ctx.sqlalchemy_exception is None
        or context.execution_options.get("shardctl_shard") is None
    ):
        return
    marked = ctx.sqlalchemy_exception
    marked.shardctl_moved = (
        context.execution_options["shardctl_shard"],
        getattr(raw, "shardctl_host", None),
    )
    marked.shardctl_first = getattr(raw, "shardctl_sent", 0) == 1


class _ShardConnection(Connection):
    """The Connections of the hosts' Engines (and a flush's per shard): a statement that meets a moved
    shard makes its session follow the move, then runs again on the new owner or raises
    :class:`~shardctl.errors.ShardMoved` (:meth:`ShardSession._followed`); later statements on this
    Connection go where the first went."""

    shardctl_session: Any = None  # the ShardSession whose transaction holds it
    shardctl_host_conn: Any = None  # a flush's per-shard Connection: the session's one to the host
    shardctl_moved_to: Any = None  # where its statements go since the move

    def _execute_context(self, dialect: Any, constructor: Any, *args: Any, **kw: Any) -> Any:
        target = self.shardctl_moved_to
        if target is None:
            try:
                return super()._execute_context(dialect, constructor, *args, **kw)
            except sqlalchemy.exc.DBAPIError as exc:
                session = self.shardctl_session
                if session is None or getattr(exc, "shardctl_moved", None) is None:
                    raise
                target = self.shardctl_moved_to = session._followed(self, exc)
                args = _options_on(target, session.shards, exc.shardctl_moved[0], args)
        return target._execute_context(dialect, constructor, *args, **kw)


def _options_on(target: Connection, shards: Shards, shard: int, args: tuple) -> tuple:
    """``_execute_context``'s (statement, parameters, execution_options, ...) with the shard's
    options on ``target``'s host: its schema may differ there (an adopted old database's ``public``,
    the fleet's ``insta5`` after the cutover)."""
    if len(args) < 3 or args[2].get("shardctl_shard") != shard:
        return args
    host = target.engine.pool.host  # type: ignore[attr-defined]
    return (args[0], args[1], args[2].union(shards.options(shard, host)), *args[3:])


# ---- routing ----------------------------------------------------------------------------------------
class _Routes:
    """Per mapped class: its ID (primary key) column and shard key column, and how each routes."""

    def __init__(self, mapper: Any):
        cls = mapper.class_
        self.table = mapper.local_table
        pk = mapper.primary_key
        self.id_col = pk[0].name if len(pk) == 1 else None
        self.id_attr = mapper.get_property_by_column(pk[0]).key if len(pk) == 1 else None
        self.key_col = getattr(cls, "__shard_key__", None)
        self.key_is_id = bool(getattr(cls, "__shard_key_is_id__", False))
        self.key_attr = (
            mapper.get_property_by_column(self.table.c[self.key_col]).key if self.key_col else None
        )
        # the ID column routes by ID, as an ID of this table (a pre-adoption ID's key is its table's)
        self.columns: dict[str, bool | str] = {self.id_col: self.table.name} if self.id_col else {}
        if self.key_col:
            self.columns[self.key_col] = self.key_is_id


_ROUTES: dict[Any, _Routes] = {}


def _routes(mapper: Any) -> _Routes:
    routes = _ROUTES.get(mapper)
    if routes is None:
        routes = _ROUTES[mapper] = _Routes(mapper)
    return routes


def _value_shards(router: Router, value: Any, is_id: bool | str) -> set[int]:
    """The shards of key or ID values; ``is_id`` a table name: IDs of that table, whose pre-adoption
    IDs are routed by their key (``Router.resolve``: one id-map lookup at most)."""
    values = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
    if isinstance(is_id, str):
        return {_wait(router.resolve(id=int(v), table=is_id)) for v in values}
    if is_id:
        return {router.shard_of_id(int(v)) for v in values}
    return {router.shard_for(v) for v in values}


def criterion_shards(
    router: Router, clause: Any, tables: dict[Any, dict[str, bool]], params: dict[str, Any]
) -> set[int] | None:
    """The shards a WHERE clause can match, from ``==``/``IN`` on a shard key or ID column of ``tables``
    (AND: the intersection of routable terms; OR: the union, when every term is routable), or None."""
    if clause is None:
        return None
    if isinstance(clause, elements.Grouping):
        return criterion_shards(router, clause.element, tables, params)
    if isinstance(clause, elements.BooleanClauseList):
        parts = [criterion_shards(router, c, tables, params) for c in clause.clauses]
        if clause.operator is operators.and_:
            known = [p for p in parts if p is not None]
            return set.intersection(*known) if known else None
        return set().union(*parts) if parts and all(p is not None for p in parts) else None
    if not isinstance(clause, elements.BinaryExpression) or clause.operator not in (
        operators.eq,
        operators.in_op,
    ):
        return None
    left, right = clause.left, clause.right
    if isinstance(left, elements.BindParameter):
        left, right = right, left
    kinds = tables.get(getattr(left, "table", None))
    if (
        kinds is None
        or getattr(left, "name", None) not in kinds
        or not isinstance(right, elements.BindParameter)
    ):
        return None
    # effective_value only when the statement's parameters lack the key (it may call a function)
    value = params[right.key] if right.key in params else right.effective_value  # noqa: SIM401
    if value is None:
        return None
    return _value_shards(router, value, kinds[left.name])


class ShardSession(Session):
    """A Session over a Router (see the module docstring): made by :func:`sessionmaker`."""

    def __init__(self, *args: Any, shards: Shards, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.shards = shards
        self.router = shards.router
        self.connection_callable = self._connection_for_object
        self._shard_conns: dict[int, tuple[Connection, Connection]] = {}

    # -- where an object lives
    def shard_of(self, obj: Any) -> int:
        """The shard of a mapped object: the shard inside its ID, else of its shard key."""
        state = inspect(obj)
        routes = _routes(state.mapper)
        if self._is_global(routes.table.name):
            return GLOBAL
        if state.key is not None and routes.id_col and len(state.key[1]) == 1:
            return self._shard_of_ident(int(state.key[1][0]), routes)
        ident = state.dict.get(routes.id_attr) if routes.id_attr else None
        if ident is not None:
            return self._shard_of_ident(int(ident), routes)
        key = state.dict.get(routes.key_attr) if routes.key_attr else None
        if key is not None:
            return next(iter(_value_shards(self.router, key, routes.key_is_id)))
        raise UnroutableStatement(
            f"no shard for a new {type(obj).__name__}: set its shard key "
            f"({routes.key_col or 'declare __shard_key__ on the model'}) or its ID"
        )

    def _shard_of_ident(self, ident: int, routes: _Routes) -> int:
        """The shard of a row of ``routes.table`` by its ID (a pre-adoption ID: by its key; a row
        of an adopted database's global table: :data:`GLOBAL`, the global tables' place)."""
        if self._is_global(routes.table.name):
            return GLOBAL
        return _wait(self.router.resolve(id=ident, table=routes.table.name))

    def _is_global(self, table: str) -> bool:
        adoption = self.router.topology.adoption
        return adoption is not None and table in adoption.globals

    # -- flush: each object's statements on its shard, over its host's connection
    def _connection_for_object(self, mapper: Any = None, instance: Any = None, **kw: Any) -> Any:
        """The flush's connection for ``instance``: one per shard (the unit of work batches statements
        by connection), each over the session's one connection to the shard's host."""
        return self._shard_connection(self.shard_of(instance), mapper)

    def _shard_connection(self, shard: int, mapper: Any = None) -> Connection:
        name = self.router._locate(shard).name
        host = super().connection(bind_arguments={"mapper": mapper, "shard": shard, "host": name})
        cached = self._shard_conns.get(shard)
        if cached is None or cached[0] is not host:
            on_shard = _ShardConnection(
                self.shards.shard_engine(shard, name),
                connection=host.connection,
                _allow_autobegin=False,
            )
            on_shard.shardctl_session, on_shard.shardctl_host_conn = self, host
            cached = self._shard_conns[shard] = (host, on_shard)
        return cached[1]

    # -- moves
    def _followed(self, conn: _ShardConnection, exc: Any) -> Connection:
        """After ``conn``'s statement met a moved shard (``exc``): follow the move, and return the
        connection to run the statement again on the shard's new host, joining this session's
        transaction, when it was the transaction's first statement; else raise
        :class:`~shardctl.errors.ShardMoved` (the next transaction goes to the new host), or ``exc`` when
        the shard did not move. The host connection it failed on is given back first (its transaction
        there is aborted) unless the error may be the application's own (a missing table, mid-transaction:
        a savepoint may hold it)."""
        shard = exc.shardctl_moved[0]
        fairy = conn._dbapi_connection
        fresh = exc.shardctl_first and self._holds_only(fairy)
        certain = getattr(exc.orig, "sqlstate", None) == MOVED_SQLSTATE
        if fresh or certain:
            self._release(fairy)
        if not self.shards.follow(exc):
            raise exc
        if not (fresh or certain):
            self._release(fairy)
        if not fresh:
            raise ShardMoved(shard, self.router._locate(shard).name) from exc
        if conn.shardctl_host_conn is not None:  # a flush's
            return self._shard_connection(shard)
        return self._connection_for_bind(self.shards.host_engine(shard))

    def _holds_only(self, fairy: Any) -> bool:
        """Whether this session's transaction holds no host connection but ``fairy``'s."""
        root = self.get_transaction()
        return root is not None and all(
            entry[0]._dbapi_connection is fairy for entry in root._connections.values()
        )

    def _release(self, fairy: Any) -> None:
        """Take the host connection ``fairy`` out of this session's transaction (and its savepoints),
        rolled back and given back to the Router."""
        trans, conn = self._transaction, None
        while trans is not None:
            for key, entry in list(trans._connections.items()):
                if entry[0]._dbapi_connection is fairy:
                    del trans._connections[key]
                    conn = entry[0]
            trans = trans._parent
        if conn is not None:
            conn.close()

    def connection(self, bind_arguments: Any = None, execution_options: Any = None) -> Connection:
        """The session's connection to a shard's host, ``bind_arguments={"shard": N}``: its statements
        (Core, text, ``exec_driver_sql``) run on shard N until another shard of the host is named."""
        shard = (bind_arguments or {}).get("shard")
        if shard is None:
            return super().connection(bind_arguments, execution_options)
        host, options = self.shards.placed(self.router.target(shard=shard))
        conn = super().connection({**bind_arguments, "host": host}, execution_options)
        return conn.execution_options(**options)

    # -- binds
    def get_bind(
        self,
        mapper: Any = None,
        *,
        clause: Any = None,
        bind: Any = None,
        shard: int | None = None,
        host: str | None = None,
        **kw: Any,
    ) -> Any:
        if bind is not None:
            return bind
        if host is not None:  # placed with the statement's schema (Shards.placed)
            return self.shards.engine(host)
        if shard is None:
            raise UnroutableStatement(
                "no shard given: route the statement (execution_options(shard=N) or "
                "a criterion on the shard key or ID)"
            )
        return self.shards.host_engine(shard)

    def get(self, entity: Any, ident: Any, **kwargs: Any) -> Any:
        """``Session.get`` on the shard inside the ID."""
        value = ident[0] if isinstance(ident, (tuple, list)) and len(ident) == 1 else ident
        if isinstance(value, dict):
            value = next(iter(value.values())) if len(value) == 1 else None
        if isinstance(value, int) and not kwargs.get("bind_arguments"):
            shard = self._shard_of_ident(value, _routes(inspect(entity)))
            kwargs["bind_arguments"] = {"shard": shard}
        return super().get(entity, ident, **kwargs)

    # -- statements
    def _route(self, orm: ORMExecuteState) -> Any:
        opts = orm.execution_options
        shard = orm.bind_arguments.get("shard")
        if shard is None and opts.get("shard") is not None:
            shard = self.router.target(shard=opts["shard"])
        shards = {shard} if shard is not None else None
        if shards is None and opts.get("all_shards"):
            shards = set(self.shards.all())
        if shards is None and (opts.get("global_") or self._on_globals(orm)):
            shards = {GLOBAL}
        if shards is None:
            shards = self._statement_shards(orm) or {0}  # IN (): no row anywhere, any shard says so
        if len(shards) == 1:
            (one,) = shards
            host, options = self.shards.placed(one)
            orm.bind_arguments.update(shard=one, host=host)
            orm.update_execution_options(**options)
            return None
        results = []
        for n in sorted(shards):
            host, options = self.shards.placed(n)
            results.append(
                orm.invoke_statement(
                    execution_options=options,
                    bind_arguments={**orm.bind_arguments, "shard": n, "host": host},
                )
            )
        # rows shard after shard; an UPDATE's or DELETE's rowcount summed
        return results[0].merge(*results[1:])

    def _on_globals(self, orm: ORMExecuteState) -> bool:
        """Whether the statement's tables are all an adopted database's global tables."""
        mappers = list(orm.all_mappers)
        return bool(mappers) and all(self._is_global(_routes(m).table.name) for m in mappers)

    def _statement_shards(self, orm: ORMExecuteState) -> set[int]:
        tables: dict[Any, dict[str, bool]] = {}
        mappers = list(orm.all_mappers)
        if orm.bind_mapper is not None:
            mappers.append(orm.bind_mapper)
        for mapper in mappers:
            routes = _routes(mapper)
            tables[routes.table] = routes.columns
        params = orm.parameters if isinstance(orm.parameters, dict) else {}
        found = criterion_shards(
            self.router, getattr(orm.statement, "whereclause", None), tables, params or {}
        )
        if found is None and orm.is_insert:
            found = self._insert_shards(orm, tables)
        if found is None:
            names = ", ".join(sorted({t.name for t in tables})) or "the statement"
            raise UnroutableStatement(
                f"no shard for a statement on {names}: filter with == or IN on the shard key or the ID, "
                f"or pass execution_options(shard=N), or execution_options(all_shards=True) to ask every shard"
            )
        return found

    def _insert_shards(
        self, orm: ORMExecuteState, tables: dict[Any, dict[str, bool]]
    ) -> set[int] | None:
        rows = orm.parameters if isinstance(orm.parameters, list) else [orm.parameters or {}]
        found: set[int] = set()
        for row in rows:
            for kinds in tables.values():
                hits = [(name, is_id) for name, is_id in kinds.items() if row.get(name) is not None]
                if not hits:
                    return None
                name, is_id = min(hits, key=lambda h: not h[1])  # the ID first
                found |= _value_shards(self.router, row[name], is_id)
        if len(found) > 1:
            raise UnroutableStatement(
                "an INSERT of rows for several shards: insert each shard's rows apart"
            )
        return found or None


@event.listens_for(ShardSession, "do_orm_execute")
def _route(orm: ORMExecuteState) -> Any:
    return orm.session._route(orm)  # type: ignore[attr-defined]


@event.listens_for(ShardSession, "after_begin")
def _joined(session: ShardSession, transaction: Any, connection: Any) -> None:
    connection.shardctl_session = session  # it follows a move for the session (_ShardConnection)


class ShardSessionMaker(_sessionmaker):
    """``sessionmaker`` of :class:`ShardSession`; :meth:`run` retries once after a move."""

    shards: Shards

    def run(self, work: Callable[[ShardSession], T]) -> T:
        """``work(session)`` in a new session, then commit. If a shard it touched had moved, the Router has
        followed the move: ``work`` runs once more in a new session (its first run was rolled back)."""
        try:
            return self._in_transaction(work)
        except ShardMoved:
            pass  # the session followed the move
        except sqlalchemy.exc.DBAPIError as exc:
            if not self.shards.follow_move(exc):
                raise
        return self._in_transaction(work)

    def _in_transaction(self, work: Callable[[ShardSession], T]) -> T:
        with self.begin() as session:  # commits, or rolls back what raised
            return work(session)


def sessionmaker(
    router: Router, *, timeout: float | None = SAME, echo: bool = False, **kwargs: Any
) -> ShardSessionMaker:
    """A session factory over ``router`` (``kwargs``: SQLAlchemy's sessionmaker options, e.g.
    ``expire_on_commit``). ``timeout``: each session transaction's bound, seconds (default: the Router's)."""
    shards = Shards(router, timeout=timeout, echo=echo)
    maker = ShardSessionMaker(class_=ShardSession, shards=shards, **kwargs)
    maker.shards = shards
    return maker


__all__ = [
    "ShardSession",
    "ShardSessionMaker",
    "Shards",
    "UnroutableStatement",
    "criterion_shards",
    "sessionmaker",
]
