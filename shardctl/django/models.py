"""Sharded models: :class:`ShardedModel` declares its shard key; its queries, saves, deletes and
refreshes run on the shard named by the key or by the object's own ID (which holds its shard), or else
on the current :func:`on_shard` block's, and follow a move once."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError, connections, models

from ..errors import BadInput
from .context import Target, current, on_shard, router

T = TypeVar("T")
Hint = dict[str, Any] | None  # {"key": v} | {"id": v} | {"shard": n} | None (the current block's)


_routing: contextvars.ContextVar[Target | None] = contextvars.ContextVar(
    "shardctl_django_routing", default=None
)


class ShardNotChosen(BadInput):
    """A sharded model's query names no shard (no shard key, no pk, no on_shard block)."""


def routed(model: type, hint: Hint, work: Callable[[], T]) -> T:
    """``work()`` on the shard of ``hint`` (else the current block's). When it fails because the shard
    has just moved away (outside a transaction block, which cannot be replayed), the Router's
    placement finds the new host (topology file reloaded, or the old host's redirect) and ``work()``
    runs once more there."""
    here = current()
    if (
        here is not None
        and _routing.get() is here
        and (hint is None or router().target(**hint) == here.shard)
    ):
        # inside a routed call on this very shard (create() -> save()): it follows moves
        return work()
    if hint is None:
        if here is None:
            raise ShardNotChosen(
                f"{model.__name__}: no shard chosen: filter by {model.shard_key} or pk, "
                "or run it in shardctl.django.on_shard(key=|id=|shard=)"
            )
        hint = {"shard": here.shard}
    for attempt in (1, 2):
        with on_shard(**hint) as where:
            token = _routing.set(where)
            try:
                return work()
            except DatabaseError as exc:
                if (
                    attempt == 2
                    or connections[where.alias].in_atomic_block
                    or not router().follow_move(where.shard, exc.__cause__ or exc, where.host)
                ):
                    raise
            finally:
                _routing.reset(token)
    raise AssertionError("unreachable")


def hint_from(model: Any, lookups: dict[str, Any]) -> Hint:
    """The shard a filter names: an equality on the pk (an ID) or on the shard key."""
    pk = model._meta.pk
    key_names = _key_names(model)
    for name, value in lookups.items():
        field = name.removesuffix("__exact")
        if value is None or isinstance(
            value, (list, tuple, set, models.expressions.BaseExpression)
        ):
            continue
        if field in ("pk", pk.name, pk.attname) and isinstance(value, int):
            return {"id": value}
        if field in key_names:
            value = getattr(value, "pk", value)
            return {"id": value} if model.shard_key_is_id else {"key": value}
    return None


def _key_names(model: Any) -> tuple[str, ...]:
    names = model.__dict__.get("_shard_key_names")
    if names is None:
        field = model._meta.get_field(model.shard_key) if model.shard_key else None
        names = (field.name, field.attname) if field else ()
        model._shard_key_names = names
    return names


class ShardedQuerySet(models.QuerySet):
    """A QuerySet that remembers the shard its filters name and runs there (else on the current block's)."""

    _shard_hint: Hint = None

    def _clone(self) -> ShardedQuerySet:
        clone = super()._clone()
        clone._shard_hint = self._shard_hint
        return clone

    def _filter_or_exclude(self, negate: bool, args: Any, kwargs: Any) -> ShardedQuerySet:
        clone = super()._filter_or_exclude(negate, args, kwargs)
        if not negate and clone._shard_hint is None:
            clone._shard_hint = hint_from(self.model, kwargs)
        return clone

    def on_shard(
        self, key: Any = None, *, id: int | None = None, shard: int | None = None
    ) -> ShardedQuerySet:
        """This query on the shard of ``key``, ``id`` or ``shard``."""
        clone = self._chain()
        clone._shard_hint = {
            name: v for name, v in (("key", key), ("id", id), ("shard", shard)) if v is not None
        }
        return clone

    def _run(self, work: Callable[[], T]) -> T:
        return routed(self.model, self._shard_hint, work)

    def _fetch_all(self) -> None:
        if self._result_cache is None:
            self._run(super()._fetch_all)

    def count(self) -> int:
        return (
            self._result_cache_len() if self._result_cache is not None else self._run(super().count)
        )

    def _result_cache_len(self) -> int:
        return len(self._result_cache)  # type: ignore[arg-type]

    def exists(self) -> bool:
        return self._run(super().exists)

    def aggregate(self, *args: Any, **kwargs: Any) -> dict:
        parent = super().aggregate
        return self._run(lambda: parent(*args, **kwargs))

    def update(self, **kwargs: Any) -> int:
        parent = super().update
        return self._run(lambda: parent(**kwargs))

    def delete(self) -> tuple[int, dict]:
        return self._run(super().delete)

    def iterator(self, chunk_size: int | None = None) -> Any:
        parent = super().iterator
        return iter(self._run(lambda: list(parent(chunk_size=chunk_size))))

    def create(self, **kwargs: Any) -> Any:
        parent = super().create
        return routed(
            self.model, self._shard_hint or hint_from(self.model, kwargs), lambda: parent(**kwargs)
        )

    def get_or_create(self, defaults: Any = None, **kwargs: Any) -> Any:
        parent = super().get_or_create
        return routed(
            self.model,
            self._shard_hint or hint_from(self.model, kwargs),
            lambda: parent(defaults=defaults, **kwargs),
        )

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list:
        """Objects grouped by their shard, one ``bulk_create`` per shard."""
        parent = super().bulk_create
        groups: dict[int, list] = {}
        for obj in objs:
            hint = obj.shard_hint() or self._shard_hint
            shard = current_shard(type(obj), hint)
            groups.setdefault(shard, []).append(obj)
        out: list = []
        for shard, group in groups.items():
            out += routed(
                self.model, {"shard": shard}, lambda group=group: parent(group, *args, **kwargs)
            )
        return out


def current_shard(model: type, hint: Hint) -> int:
    if hint is None:
        here = current()
        if here is None:
            raise ShardNotChosen(f"{model.__name__}: no shard chosen for a new object")
        return here.shard
    return router().target(**hint)


ShardedManager = models.Manager.from_queryset(ShardedQuerySet)


class ShardIdField(models.BigAutoField):
    """The primary key: ``bigint DEFAULT next_id()``, the shard's ID function (found through the
    migration's ``search_path``), so that every ID names its shard."""

    def db_type_suffix(self, connection: Any) -> str:
        return "DEFAULT next_id()"

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        return name, "shardctl.django.models.ShardIdField", args, kwargs


class ShardedModel(models.Model):
    """A model stored in every shard's schema. ``shard_key``: the field that routes it (by the
    topology's rule, or, with ``shard_key_is_id``, as an ID minted on the shard, e.g. a like's
    ``photo_id``); its pk, an ID, names its shard too."""

    shard_key: str | None = None
    shard_key_is_id = False

    objects = ShardedManager()

    class Meta:
        abstract = True

    def shard_hint(self) -> Hint:
        if self.pk is not None:
            return {"id": self.pk}
        if self.shard_key:
            value = getattr(self, self._meta.get_field(self.shard_key).attname)
            if value is not None:
                return {"id": value} if self.shard_key_is_id else {"key": value}
        return None

    def save(self, *args: Any, **kwargs: Any) -> None:
        parent = super().save
        routed(type(self), self.shard_hint(), lambda: parent(*args, **kwargs))

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        parent = super().delete
        return routed(type(self), self.shard_hint(), lambda: parent(*args, **kwargs))

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        parent = super().refresh_from_db
        routed(type(self), self.shard_hint(), lambda: parent(*args, **kwargs))
