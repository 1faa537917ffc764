"""Transactions on a shard: :func:`atomic` opens ``transaction.atomic`` on the connection of the shard
it names, and :func:`retry_on_move` runs a view (or any unit of work) once more when its transaction
met a shard that had moved (:class:`~shardctl.errors.ShardMoved`)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction
from django.db import transaction

from ..errors import ShardMoved
from ..router.placement import Key
from .context import Target, on_shard

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("shardctl.django")


@contextmanager
def atomic(
    key: Key = None,
    *,
    id: int | None = None,
    shard: int | None = None,
    force_string: bool = False,
    table: str | None = None,
    savepoint: bool = True,
    durable: bool = False,
) -> Iterator[Target]:
    """``on_shard(key=|id=|shard=)`` and ``transaction.atomic`` on that shard's host connection: the
    block's writes to the shard (and to other shards of that host) commit or roll back together.
    ``table`` names the table of ``id`` (a pre-adoption ID needs it, as in ``on_shard``).
    A write to a shard of another host inside it is refused (``UncoveredWrite``)."""
    with (
        on_shard(key, id=id, shard=shard, force_string=force_string, table=table) as here,
        transaction.atomic(using=here.alias, savepoint=savepoint, durable=durable),
    ):
        yield here


def retry_on_move(work: F) -> F:
    """``work(...)`` (a view, sync or async), and once more when it raised ``ShardMoved``: its
    transaction was rolled back, and the Router now routes the shard to its new host."""
    if iscoroutinefunction(work):

        @functools.wraps(work)
        async def again_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await work(*args, **kwargs)
            except ShardMoved as exc:
                log.info("%s: %s; running it again", work.__qualname__, exc)
                return await work(*args, **kwargs)

        return again_async  # type: ignore[return-value]

    @functools.wraps(work)
    def again(*args: Any, **kwargs: Any) -> Any:
        try:
            return work(*args, **kwargs)
        except ShardMoved as exc:
            log.info("%s: %s; running it again", work.__qualname__, exc)
            return work(*args, **kwargs)

    return again  # type: ignore[return-value]
