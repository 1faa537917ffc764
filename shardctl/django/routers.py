"""``DATABASE_ROUTERS = ["shardctl.django.DatabaseRouter"]``: sharded models go to the current shard's
host alias; Django's own ``migrate`` leaves the shards to ``shardctl migrate``."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import connections

from ..router.placement import GLOBAL
from .context import _current, alias_of, collecting, router
from .models import ShardedModel, ShardNotChosen


def sharded(model: Any) -> bool:
    return isinstance(model, type) and issubclass(model, ShardedModel)


def host_alias(db: str) -> bool:
    return bool(connections.settings.get(db, {}).get("SHARDCTL_HOST"))


def global_alias(model: Any) -> str | None:
    """An adopted database's global table (``adoption.globals``): the alias of where they are now
    (the old database, then ``placement.global_host``); None for any other unsharded model."""
    topo = router().topology
    meta = getattr(model, "_meta", None)
    if topo.adoption is None or meta is None or meta.db_table not in topo.adoption.globals:
        return None
    return alias_of(router()._locate(GLOBAL), GLOBAL)


class DatabaseRouter:
    def _alias(self, model: Any) -> str | None:
        if not sharded(model):
            return global_alias(model)
        here = _current.get()  # current(), without a call: Django asks on every query
        if here is None:
            raise ShardNotChosen(
                f"{model.__name__}: no shard chosen: filter by {model.shard_key} or pk, "
                "or run it in shardctl.django.on_shard(key=|id=|shard=)"
            )
        return here.alias

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        if sharded(type(obj1)) or sharded(type(obj2)):
            return obj1._state.db == obj2._state.db
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        """Nothing on the host aliases (``shardctl migrate`` applies the shards' files); sharded models
        only while ``shardctl_makemigrations`` collects their SQL."""
        if host_alias(db):
            return False
        model = hints.get("model")
        # a migration's historical model: its class in the app registry says more
        if model is not None:
            app_label, model_name = model._meta.app_label, model._meta.model_name
        model = None
        if model_name is not None:
            try:
                model = apps.get_model(app_label, model_name)
            except LookupError:
                model = None
        if sharded(model):
            return collecting()
        return False if collecting() else None
