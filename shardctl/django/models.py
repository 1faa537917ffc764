"""Sharded models: :class:`ShardedModel` declares its shard key; its queries, saves, deletes and
refreshes run on the shard named by the key or by the object's own ID (which holds its shard), or else
on the current :func:`on_shard` block's, and follow a move. A query whose filters name several shards
(``__in`` on the key or the ID, ``all_shards()``) runs on each of them; a filter on the key or the ID
that names no shards (a range, a subquery) is refused rather than run on one shard."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import DatabaseError, connections, models
from django.db.models import Q

from ..errors import BadInput, ShardMoved
from ..sql.catalog.control import MOVED_SQLSTATE
from .context import Target, _current, current, router, shard_target

T = TypeVar("T")
Hint = dict[str, Any] | None  # {"key": v} | {"id": v} | {"shard": n} | None (the current block's)
# the shards a filter names | the lookup on the key or the pk that names none | None (neither)
Shards = frozenset[int] | str | None


# A statement that met its shard moved out (the old host's stub) or its schema gone: the transaction
# is over on the server whatever happens next.
GONE = frozenset({MOVED_SQLSTATE, "3F000"})

_routing: contextvars.ContextVar[Target | None] = contextvars.ContextVar(
    "shardctl_django_routing", default=None
)


class ShardNotChosen(BadInput):
    """A sharded model's query names no shard (no shard key, no pk, no on_shard block)."""


class UnroutableQuery(BadInput):
    """A filter on the shard key or the ID that names no set of shards (a range, a subquery, an OR with
    other terms), or work that cannot be split over several shards: refused, never run on one shard."""


class UncoveredWrite(BadInput):
    """A write to a shard whose host is outside the ``transaction.atomic()`` block open on another
    database (``default``, or another host): refused, never committed outside the transaction."""


def routed(model: type, hint: Hint, work: Callable[[], T], *, write: bool = False) -> T:
    """``work()`` on the shard of ``hint`` (else the current block's). A write is refused when a
    transaction is open on another database of this thread but not on the shard's. When ``work()``
    fails because the shard has just moved away, the Router's placement finds the new host (topology
    file reloaded, or the old host's redirect): outside a transaction ``work()`` runs once more there;
    inside one, which cannot be replayed, :class:`~shardctl.errors.ShardMoved` says so."""
    here = _current.get()  # current(), without a call: every ORM call comes here, some twice
    if here is not None and _routing.get() is here and (hint is None or _shard(hint) == here.shard):
        # inside a routed call on this very shard (create() -> save()): it follows moves
        return work()
    if hint is None:
        if here is None:
            raise ShardNotChosen(
                f"{model.__name__}: no shard chosen: filter by {model.shard_key} or pk, "
                "or run it in shardctl.django.on_shard(key=|id=|shard=)"
            )
        number = here.shard
    else:
        number = _shard(hint)
    for attempt in (1, 2):
        where = shard_target(number)  # as on_shard(shard=number), without a generator per call
        # The shard moved (a cutover's flip, a redirect followed) since this block chose its host:
        # a transaction open there cannot follow it, and one on the new host would not be its.
        if (
            here is not None
            and here.shard == number
            and here.alias != where.alias
            and connections[here.alias].in_atomic_block
        ):
            raise ShardMoved(number, where.host.name)
        if write:
            _check_covered(model, where)
        shard_token, routing_token = _current.set(where), _routing.set(where)
        try:
            return work()
        except DatabaseError as exc:
            if attempt == 2:
                raise
            conn = connections[where.alias]
            if conn.in_atomic_block and _sqlstate(exc) in GONE:
                _abandon(conn)
            if not _moved(where, exc):
                raise
            if conn.in_atomic_block:
                new = router().placement.locate(where.shard).name
                raise ShardMoved(where.shard, new) from exc
        finally:
            _routing.reset(routing_token)
            _current.reset(shard_token)
    raise AssertionError("unreachable")


def _shard(hint: dict[str, Any]) -> int:
    """The shard a hint (``{"key"|"id"|"shard": value}``, or an ``id`` with its ``table``) names:
    what ``Router.resolve(**hint)`` says (a ``{"shard": n}`` hint comes from a shard this module
    computed or checked), without its keyword checks on the common one-keyword hints."""
    if len(hint) != 1:  # an ID with its table (a pre-adoption ID's key is in the id map)
        return router().resolve(**hint)
    ((kind, value),) = hint.items()
    if kind == "shard":
        return value
    if kind == "id":
        return router().shard_of_id(value)
    return router().shard_for(value)


def _sqlstate(exc: DatabaseError) -> str | None:
    return getattr(exc.__cause__, "sqlstate", None)


def _abandon(conn: Any) -> None:
    """End the server's side of an atomic block whose shard has moved away (the block cannot go on):
    a transaction pooler gets its server connection back before the move is followed, which may need
    one of its own (the old host's redirect); Django refuses the block's further queries and rolls
    back when it ends, as after any error in it."""
    conn.needs_rollback = True
    try:
        conn.connection.rollback()
    except Exception:  # noqa: BLE001, S110 - a broken connection: Django discards it at the block's end
        pass


def _moved(where: Target, exc: DatabaseError) -> bool:
    """True when ``exc`` says ``where``'s shard moved away and its new host is known (the placement
    then routes there: this request's next statement, or the next request's)."""
    return router().follow_move(where.shard, exc.__cause__ or exc, where.host)


def _check_covered(model: type, where: Target) -> None:
    """Refuse a write that a transaction open on another database would not cover."""
    if connections[where.alias].in_atomic_block:
        return
    # this thread's open connections (as alias_of reads them): one look at each other alias, where
    # connections.all(initialized_only=True) takes two at each
    opened = connections._connections
    for alias in connections.settings:
        other = getattr(opened, alias, None) if alias != where.alias else None
        if other is not None and other.in_atomic_block:
            raise UncoveredWrite(
                f"{model.__name__}: a write to shard {where.shard} (database {where.alias!r}) inside "
                f"transaction.atomic() on {other.alias!r}, which does not cover it: use "
                "shardctl.django.atomic(key=|id=|shard=), or transaction.atomic(using=...) with "
                "the shard's alias (on_shard(...).alias)"
            )


def _value(field: Any, value: Any) -> Any:
    """``value`` as the field holds it (``"123"`` -> 123 for an integer field), so that it routes as
    the stored value does."""
    value = getattr(value, "pk", value) if isinstance(value, models.Model) else value
    return value if type(value) is int else field.to_python(value)


def _routes(model: Any) -> dict[str, tuple[Any, bool]]:
    """A name of the pk (``pk``, its name and attname) or of the shard key -> (its field, whether its
    values are IDs); the pk wins where both have a name. Cached on the model."""
    routes = model.__dict__.get("_shard_routes")
    if routes is None:
        pk = model._meta.pk
        routes = dict.fromkeys(("pk", pk.name, pk.attname), (pk, True))
        if model.shard_key:
            field = model._meta.get_field(model.shard_key)
            for name in (field.name, field.attname):
                routes.setdefault(name, (field, model.shard_key_is_id))
        model._shard_routes = routes
    return routes


def _lookup_shards(model: Any, name: str, value: Any) -> Shards:
    """The shards one lookup names: a set (``=`` or ``__in`` on the pk or the shard key), its name
    when it is on one of them but names no set, None when it is on neither."""
    field_name, _, lookup = name.partition("__")
    route = _routes(model).get(field_name)
    if route is None:
        return None
    field, by_id = route
    if lookup not in ("", "exact", "in"):
        return name
    if lookup != "in":
        values: Iterable[Any] = (value,)
    elif isinstance(value, (list, tuple, set, frozenset)):
        values = value
    else:
        return name  # a subquery or an expression
    r = router()
    shard_of = r.shard_of_id if by_id else r.shard_for
    shards = set()
    for v in values:
        if type(v) is not int:  # a key or an ID as the field holds it: most lookups
            if v is None:  # = None matches no row; IN drops None
                continue
            if hasattr(v, "resolve_expression"):
                return name
            try:
                v = _value(field, v)
            except (ValidationError, ValueError, TypeError):
                return None  # not a value of the field: Django says so when it builds the query
        if by_id and field is model._meta.pk:  # a pre-adoption ID: its table's key (id map)
            shards.add(r.resolve(id=v, table=model._meta.db_table))
        else:
            shards.add(shard_of(v))
    return frozenset(shards)


def _q_shards(model: Any, q: Q) -> Shards:
    """The shards a Q names: AND intersects what its terms name, OR joins them (every term must name
    shards); a negation only narrows the rows of whatever shards the rest names."""
    if q.negated:
        return None
    parts = [
        _q_shards(model, child)
        if isinstance(child, Q)
        else _lookup_shards(model, *child)
        if isinstance(child, tuple)
        else None  # a boolean expression: no lookup on the key or the pk by name
        for child in q.children
    ]
    if q.connector == Q.AND:
        return _and(parts)
    sets = [p for p in parts if isinstance(p, frozenset)]
    unrouted = [p for p in parts if isinstance(p, str)]
    if len(sets) == len(parts):
        return frozenset().union(*sets)
    if not sets and not unrouted:
        return None
    return unrouted[0] if unrouted else f"an OR of {model.shard_key} or pk with other terms"


def _and(parts: list[Shards]) -> Shards:
    """What terms joined by AND name: the shards every set names, else the first unroutable term."""
    sets = [p for p in parts if isinstance(p, frozenset)]
    if sets:
        return frozenset.intersection(*sets)
    return next((p for p in parts if isinstance(p, str)), None)


def _kwargs_shards(model: Any, lookups: dict[str, Any]) -> Shards:
    """What ``filter(**lookups)`` names: ``_q_shards(model, Q(**lookups))`` without building the Q
    (every create and get by key or ID comes here), looking only at the lookups on the pk or the key."""
    routes = _routes(model)
    named = [name for name in lookups if name.partition("__")[0] in routes]
    if len(named) == 1:
        return _lookup_shards(model, named[0], lookups[named[0]])
    return _and([_lookup_shards(model, name, lookups[name]) for name in sorted(named)])


def hint_from(model: Any, lookups: dict[str, Any]) -> Hint:
    """The one shard that field values (``create(**kwargs)``) or filters name, else None."""
    shards = _kwargs_shards(model, lookups) if lookups else None
    if isinstance(shards, frozenset) and len(shards) == 1:
        return {"shard": next(iter(shards))}
    return None


class Parts(list):
    """The results of a query's clones, one per shard, in shard order."""


class ShardedQuerySet(models.QuerySet):
    """A QuerySet that runs on the shards its filters name (else on the current block's), one after
    the other when they name several."""

    _shards: frozenset[int] | None = None  # what the filters name (intersected)
    _unrouted: str | None = None  # a filter on the key or the pk that names no shards
    _chosen: tuple[int, ...] | None = None  # on_shard(...) / all_shards(): wins over the filters

    def _clone(self) -> ShardedQuerySet:
        clone = super()._clone()
        clone._shards, clone._unrouted, clone._chosen = self._shards, self._unrouted, self._chosen
        return clone

    def _filter_or_exclude(self, negate: bool, args: Any, kwargs: Any) -> ShardedQuerySet:
        clone = super()._filter_or_exclude(negate, args, kwargs)
        if not negate:
            named = (
                _q_shards(self.model, Q(*args, **kwargs))
                if args
                else _kwargs_shards(self.model, kwargs)
            )
            if isinstance(named, frozenset):
                clone._shards = named if clone._shards is None else clone._shards & named
            elif named is not None and clone._unrouted is None:
                clone._unrouted = named
        return clone

    def on_shard(
        self, key: Any = None, *, id: int | None = None, shard: int | None = None
    ) -> ShardedQuerySet:
        """This query on the shard of ``key``, ``id`` or ``shard``, whatever its filters say."""
        clone = self._chain()
        clone._chosen = (router().target(key, id=id, shard=shard),)
        return clone

    def all_shards(self) -> ShardedQuerySet:
        """This query on every shard of the topology, one after the other."""
        clone = self._chain()
        clone._chosen = tuple(range(router().topology.shard_count))
        return clone

    def _targets(self) -> tuple[int, ...] | None:
        """The shards this query runs on (None: the current block's)."""
        if self._chosen is not None:
            return self._chosen
        if self._shards is not None:
            return tuple(sorted(self._shards))
        if self._unrouted is not None:
            raise UnroutableQuery(
                f"{self.model.__name__}: cannot route {self._unrouted}: filter {self.model.shard_key} "
                "or pk by = or __in, or name the shards with .on_shard(...) or .all_shards()"
            )
        return None

    def _run(
        self,
        work: Callable[[], T],
        each: Callable[[ShardedQuerySet], T],
        *,
        write: bool = False,
        shards: tuple[int, ...] | None = None,
    ) -> Any:
        """``work()`` on this query's one shard (or the block's); else ``each(clone)`` for a clone of
        it on each of its shards: the list of their results. ``shards``: ``_targets()``, when the
        caller has it already."""
        if shards is None:
            shards = self._targets()
        if shards is None:
            return routed(self.model, None, work, write=write)
        if len(shards) == 1:
            return routed(self.model, {"shard": shards[0]}, work, write=write)
        out = Parts()
        for n in shards:
            clone = self._chain()
            clone._chosen = (n,)
            out.append(each(clone))
        return out

    def _fetch_all(self) -> None:
        if self._result_cache is not None:
            return
        q = self.query
        low, high = q.low_mark, q.high_mark
        shards = self._targets()
        many = shards is not None and len(shards) > 1
        order = self._merge_order() if many else []
        if q.is_sliced and order is None:
            raise UnroutableQuery(
                f"{self.model.__name__}: a slice of rows from several shards in an order not of "
                "the model's own fields: slice each shard's query (.on_shard(...)) and merge them"
            )

        def each(clone: ShardedQuerySet) -> list:
            if q.is_sliced:  # the first `high` rows of each shard, then the slice of them all
                clone.query.clear_limits()
                clone.query.set_limits(0, high)
            clone._fetch_all()
            return clone._result_cache  # type: ignore[return-value]

        got = self._run(super()._fetch_all, each, shards=shards)
        if isinstance(got, Parts):
            rows = [row for part in got for row in part]
            for attname, descending in reversed(order or ()):  # stable: the last key first
                rows.sort(key=_sort_key(attname), reverse=descending)
            self._result_cache = rows[low:high] if q.is_sliced else rows
            self._prefetch_done = True

    def _merge_order(self) -> list[tuple[str, bool]] | None:
        """The query's order as (attribute, descending) pairs to merge several shards' rows by ([]:
        unordered); None when it is not an order of model instances by their own fields."""
        q = self.query
        terms = q.order_by or (self.model._meta.ordering if q.default_ordering else ())
        if not terms:
            return []
        if self._iterable_class is not models.query.ModelIterable:
            return None
        order = []
        for term in terms:
            name = term.lstrip("-") if isinstance(term, str) else "?"
            try:
                field = self.model._meta.pk if name == "pk" else self.model._meta.get_field(name)
            except FieldDoesNotExist:
                return None
            if not getattr(field, "concrete", False):
                return None
            order.append((field.attname, term.startswith("-")))
        return order

    def count(self) -> int:
        if self._result_cache is not None or (
            self.query.is_sliced and len(self._targets() or ()) > 1
        ):
            self._fetch_all()
            return len(self._result_cache)  # type: ignore[arg-type]
        got = self._run(super().count, lambda clone: clone.count())
        return sum(got) if isinstance(got, Parts) else got

    def exists(self) -> bool:
        got = self._run(super().exists, lambda clone: clone.exists())
        return any(got) if isinstance(got, Parts) else got

    def aggregate(self, *args: Any, **kwargs: Any) -> dict:
        shards = self._targets()
        if shards is not None and len(shards) != 1:
            raise UnroutableQuery(
                f"{self.model.__name__}: aggregate() over {len(shards)} shards: aggregate each "
                "shard's query (.on_shard(...)) and combine them"
            )
        parent = super().aggregate
        return self._run(lambda: parent(*args, **kwargs), lambda clone: {})

    def update(self, **kwargs: Any) -> int:
        parent = super().update
        got = self._run(lambda: parent(**kwargs), lambda clone: clone.update(**kwargs), write=True)
        return sum(got) if isinstance(got, Parts) else got

    def delete(self) -> tuple[int, dict]:
        got = self._run(super().delete, lambda clone: clone.delete(), write=True)
        if not isinstance(got, Parts):
            return got
        per_model: dict[str, int] = {}
        for _, counts in got:
            for label, n in counts.items():
                per_model[label] = per_model.get(label, 0) + n
        return sum(n for n, _ in got), per_model

    def iterator(self, chunk_size: int | None = None) -> Any:
        parent = super().iterator
        got = self._run(
            lambda: list(parent(chunk_size=chunk_size)),
            lambda clone: list(clone.iterator(chunk_size=chunk_size)),
        )
        return iter([row for part in got for row in part] if isinstance(got, Parts) else got)

    def _one(self, kwargs: dict[str, Any]) -> Hint:
        """The shard of a write: the one chosen or named by the filters, else the one the field
        values name (else the current block's)."""
        shards = self._chosen if self._chosen is not None else self._shards
        if shards is not None and len(shards) == 1:
            return {"shard": next(iter(shards))}
        return hint_from(self.model, kwargs)

    def create(self, **kwargs: Any) -> Any:
        parent = super().create
        return routed(self.model, self._one(kwargs), lambda: parent(**kwargs), write=True)

    def get_or_create(self, defaults: Any = None, **kwargs: Any) -> Any:
        parent = super().get_or_create
        work = lambda: parent(defaults=defaults, **kwargs)
        return routed(self.model, self._one(kwargs), work, write=True)

    def update_or_create(self, defaults: Any = None, **kwargs: Any) -> Any:
        parent = super().update_or_create
        work = lambda: parent(defaults=defaults, **kwargs)
        return routed(self.model, self._one(kwargs), work, write=True)

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list:
        """Objects grouped by their shard, one ``bulk_create`` per shard."""
        parent = super().bulk_create
        groups: dict[int, list] = {}
        for obj in objs:
            hint = obj.shard_hint() or self._one({})
            shard = current_shard(type(obj), hint)
            groups.setdefault(shard, []).append(obj)
        out: list = []
        for shard, group in groups.items():
            out += routed(
                self.model,
                {"shard": shard},
                lambda group=group: parent(group, *args, **kwargs),
                write=True,
            )
        return out


def _sort_key(attname: str) -> Callable[[Any], tuple]:
    """A row's sort key on ``attname``: NULLs last ascending and first descending, as PostgreSQL."""

    def key(row: Any) -> tuple:
        value = getattr(row, attname)
        return (value is None, value)

    return key


def current_shard(model: type, hint: Hint) -> int:
    if hint is None:
        here = current()
        if here is None:
            raise ShardNotChosen(f"{model.__name__}: no shard chosen for a new object")
        return here.shard
    return _shard(hint)


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
    topology's rule, or, with ``shard_key_is_id``, as an ID minted on the shard, e.g. a photo's
    ``user_id`` or a like's ``photo_id``: the row then lives with that user or photo); its pk, an ID,
    names its shard too."""

    shard_key: str | None = None
    shard_key_is_id = False

    objects = ShardedManager()

    class Meta:
        abstract = True

    def shard_hint(self) -> Hint:
        if self.pk is not None:  # its table: a pre-adoption ID routes by its table's key
            return {"id": _value(self._meta.pk, self.pk), "table": self._meta.db_table}
        if self.shard_key:
            field = self._meta.get_field(self.shard_key)
            value = getattr(self, field.attname)
            if value is not None:
                value = _value(field, value)
                if self.shard_key_is_id:  # an ID held as a key: a pre-adoption one is its key
                    return {"shard": router().shard_of_id(value)}
                return {"key": value}
        return None

    def save(self, *args: Any, **kwargs: Any) -> None:
        parent = super().save
        routed(type(self), self.shard_hint(), lambda: parent(*args, **kwargs), write=True)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        parent = super().delete
        return routed(type(self), self.shard_hint(), lambda: parent(*args, **kwargs), write=True)

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        parent = super().refresh_from_db
        routed(type(self), self.shard_hint(), lambda: parent(*args, **kwargs))
