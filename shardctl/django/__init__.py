"""Django on a shardctl fleet: ``DATABASES`` from the topology (an alias per host), a backend that puts
every transaction on its shard without session state (pooler-safe), a database router, a model mixin
routing by shard key or ID (fanning out over the shards an ``__in`` names), a nestable ``on_shard``
block, ``atomic`` (a transaction on a shard), ``retry_on_move`` (a view again after ``ShardMoved``), a
middleware that lets no shard leak from one request to the next, and ``manage.py
shardctl_makemigrations``.

settings.py::

    import shardctl.django
    DATABASES = shardctl.django.databases("shardctl.yaml")
    DATABASE_ROUTERS = ["shardctl.django.DatabaseRouter"]
    MIDDLEWARE = ["shardctl.django.ShardMiddleware", ...]
    INSTALLED_APPS = [..., "shardctl.django"]

models.py::

    from shardctl.django.models import ShardedModel, ShardIdField
    class Photo(ShardedModel):
        shard_key, shard_key_is_id = "user_id", True  # on its owner's shard (the one in the user's ID)
        id = ShardIdField(primary_key=True)
        user_id = models.BigIntegerField()

Importing this package does not import Django's ORM (settings.py imports it before Django is set up).
"""

from __future__ import annotations

from typing import Any

from ..errors import ShardMoved
from .context import Target, configure, current, no_shard, on_shard, router, target
from .settings import databases, host_database

__all__ = [
    "DatabaseRouter",
    "ShardMiddleware",
    "ShardMoved",
    "ShardedModel",
    "Target",
    "atomic",
    "configure",
    "current",
    "databases",
    "host_database",
    "no_shard",
    "on_shard",
    "retry_on_move",
    "router",
    "target",
]


def __getattr__(name: str) -> Any:
    if name == "DatabaseRouter":
        from .routers import DatabaseRouter

        return DatabaseRouter
    if name == "ShardMiddleware":
        from .middleware import ShardMiddleware

        return ShardMiddleware
    if name in (
        "ShardedModel",
        "ShardIdField",
        "ShardNotChosen",
        "UnroutableQuery",
        "UncoveredWrite",
    ):
        from . import models

        return getattr(models, name)
    if name in ("atomic", "retry_on_move"):
        from . import transactions

        return getattr(transactions, name)
    raise AttributeError(name)
