"""The application's Router: route a key, an ID or a shard number to its shard's host and hand out a
pooled connection there (:class:`Router`), or the same for asyncio (:class:`AsyncRouter`).

Modules: ``_async`` (:class:`AsyncRouter`), ``_sync`` (:class:`Router`), ``placement`` (routing,
topology file and redirects; the options and the calls' keywords), ``session`` (what one call sends),
``pool`` (per-host pool bookkeeping, breaker, watchdog). See docs/router.md.
"""

from ._async import AsyncRouter
from ._sync import Router
from .placement import (
    MOVED_ERRORS,
    SAME,
    BlockTarget,
    CallTarget,
    Key,
    Placement,
    ReadTarget,
    RouterOptions,
    Target,
)
from .session import forget_prepared

__all__ = [
    "MOVED_ERRORS",
    "SAME",
    "AsyncRouter",
    "BlockTarget",
    "CallTarget",
    "Key",
    "Placement",
    "ReadTarget",
    "Router",
    "RouterOptions",
    "Target",
    "forget_prepared",
]
