"""shardctl.sqlalchemy's sessions for asyncio: SQLAlchemy's ``AsyncSession`` over an
:class:`~shardctl.AsyncRouter`. Needs SQLAlchemy's asyncio layer (greenlet): ``shardctl[sqlalchemy-asyncio]``.

Glue in an application::

    from shardctl import AsyncRouter, Topology
    from shardctl.sqlalchemy.asyncio import async_sessionmaker

    Session = async_sessionmaker(AsyncRouter(Topology.load("shardctl.yaml")), expire_on_commit=False)

    async with Session() as session:
        session.add(Photo(user_id=42, caption="hi")); await session.commit()
        await session.get(Photo, photo_id)                                        # the shard inside the ID
        await session.scalars(select(Photo).where(Photo.user_id == 42))          # the shard of the key
        await session.scalars(select(Photo).execution_options(all_shards=True))  # every shard, when asked

Everything is :mod:`shardctl.sqlalchemy`'s: an ``AsyncSession`` runs a sync :class:`ShardSession`
(``sync_session_class``) in SQLAlchemy's greenlet, so routing, placement and refusals are the same
code. Only the binds differ: each host's Engine is the sync face of an asyncio Engine
(``postgresql+psycopg_async``) whose pool lends the AsyncRouter's connections (:meth:`AsyncRouter.lend`:
its pool, breaker, timeouts and stats), one per host per session transaction, each loan awaited from
the greenlet. Sessions follow moves (``ShardMoved`` when a transaction cannot), take savepoints and
report errors as the sync ones do; ``Session.run(work)`` retries once after a move, as the sync
``run`` does.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import sqlalchemy
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.ext.asyncio import async_sessionmaker as _async_sessionmaker

from ..errors import ShardMoved
from ..router import SAME, AsyncRouter
from . import Shards, ShardSession, _exc_info, _LendingPool, _wait

T = TypeVar("T")
if tuple(int(part) for part in re.findall(r"\d+", sqlalchemy.__version__)[:3]) < (2, 0, 16):
    raise ImportError(
        f"shardctl.sqlalchemy.asyncio needs SQLAlchemy 2.0.16 or later (this is {sqlalchemy.__version__}): "
        "pip install 'shardctl[sqlalchemy-asyncio]'"
    )


class _AsyncLendingPool(_LendingPool):
    """:class:`_LendingPool` for asyncio engines: the loans are :meth:`AsyncRouter.lend`'s, awaited from
    SQLAlchemy's greenlet, and each psycopg ``AsyncConnection`` is wrapped by the asyncio dialect once."""

    _is_asyncio = True

    def _lent_connection(self) -> Any:
        conn = self._local.conn

        async def lent() -> Any:
            return conn

        return self._dialect.loaded_dbapi.connect(async_creator_fn=lent)

    def _borrow(self) -> tuple[Any, Any]:
        loan = self._router.lend(self._host, timeout=self._timeout)
        return loan, _wait(loan.__aenter__())

    def _give_back(self, loan: Any, error: BaseException | None) -> None:
        try:
            _wait(loan.__aexit__(*_exc_info(error)))
        except sqlalchemy.exc.MissingGreenlet:
            # The garbage collector's check-in of a session never closed: nothing to await in, so the
            # event loop ends the loan (the AsyncRouter's pool gets its slot back, the error recorded).
            ending = asyncio.get_running_loop().create_task(loan.__aexit__(*_exc_info(error)))
            _ENDING.add(ending)
            ending.add_done_callback(_ended)


# loans being ended on the loop (a task must be referenced to run)
_ENDING: set[asyncio.Task] = set()


def _ended(task: asyncio.Task) -> None:
    _ENDING.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: the pool has recorded it


class AsyncShards(Shards):
    """:class:`Shards` over an :class:`~shardctl.AsyncRouter`: each host's Engine is the sync face of an
    asyncio Engine (``postgresql+psycopg_async``) whose pool lends the AsyncRouter's connections."""

    pool_class = _AsyncLendingPool
    router: AsyncRouter  # type: ignore[assignment]

    def _create_engine(self, pool: _LendingPool) -> Engine:
        return create_async_engine(
            "postgresql+psycopg_async://", pool=pool, echo=self.echo
        ).sync_engine

    async def follow_move(self, exc: BaseException) -> bool:  # type: ignore[override]
        """:meth:`Shards.follow_move`, awaited."""
        moved = self.moved(exc)
        return moved is not None and await self.router.follow_move(*moved)


class AsyncShardSession(AsyncSession):
    """SQLAlchemy's ``AsyncSession`` over a :class:`ShardSession` (the same routing, run in SQLAlchemy's
    greenlet): made by :func:`async_sessionmaker`."""

    sync_session_class = ShardSession

    def __init__(self, *args: Any, shards: AsyncShards, **kwargs: Any):
        super().__init__(*args, shards=shards, **kwargs)
        self.shards = shards
        self.router = shards.router

    def shard_of(self, obj: Any) -> int:
        """:meth:`ShardSession.shard_of`."""
        return self.sync_session.shard_of(obj)  # type: ignore[attr-defined]


class AsyncShardSessionMaker(_async_sessionmaker):
    """``async_sessionmaker`` of :class:`AsyncShardSession`; :meth:`run` retries once after a move."""

    shards: AsyncShards

    async def run(self, work: Callable[[AsyncShardSession], Awaitable[T]]) -> T:
        """:meth:`ShardSessionMaker.run` for asyncio: ``await work(session)`` in a new session, then
        commit; once more in a new session if a shard it touched had moved."""
        try:
            async with self.begin() as session:  # commits, or rolls back what raised
                return await work(session)
        except ShardMoved:
            pass  # the session followed the move
        except sqlalchemy.exc.DBAPIError as exc:
            if not await self.shards.follow_move(exc):
                raise
        async with self.begin() as session:
            return await work(session)


def async_sessionmaker(
    router: AsyncRouter, *, timeout: float | None = SAME, echo: bool = False, **kwargs: Any
) -> AsyncShardSessionMaker:
    """:func:`sessionmaker` for asyncio: a factory of ``AsyncSession``s over ``router`` (an
    :class:`~shardctl.AsyncRouter`, used from its event loop); ``kwargs``: SQLAlchemy's
    ``async_sessionmaker`` options, e.g. ``expire_on_commit=False``."""
    shards = AsyncShards(router, timeout=timeout, echo=echo)
    maker = AsyncShardSessionMaker(class_=AsyncShardSession, shards=shards, **kwargs)
    maker.shards = shards
    return maker


__all__ = ["AsyncShardSession", "AsyncShardSessionMaker", "AsyncShards", "async_sessionmaker"]
