"""The application's Router: route a key, an ID or a shard number to its shard's host and hand out a
pooled connection there (:class:`Router`), or the same for asyncio (:class:`AsyncRouter`).

Modules: ``_async`` (the Routers' one source: :class:`AsyncRouter`), ``_sync`` (:class:`Router`,
generated from it by ``make generate``), ``placement`` (routing,
topology file and redirects; a call's shard and bounds; the options), ``session`` (what one call sends),
``pool`` (per-host pool bookkeeping, breaker, watchdog). See docs/router.md.
"""

from ._async import AsyncRouter
from ._sync import (
    Router,
    RouterClientCursor,
    RouterConnection,
    RouterCursor,
    RouterServerCursor,
    forget_prepared,
)
from .placement import (
    MOVED_ERRORS,
    SAME,
    Key,
    Placement,
    RouterOptions,
)

__all__ = [
    "MOVED_ERRORS",
    "SAME",
    "AsyncRouter",
    "Key",
    "Placement",
    "Router",
    "RouterClientCursor",
    "RouterConnection",
    "RouterCursor",
    "RouterOptions",
    "RouterServerCursor",
    "forget_prepared",
]
