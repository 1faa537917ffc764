"""Adopting one live PostgreSQL database into a fleet: ``plan`` (read-only: shard keys, blockers,
query classes) and ``baseline`` (the adopted tables' definitions as the fleet's first migration).
``verify``: each shard's rows against the source's, and dark reads. ``cutover`` (with ``abort``
and ``cleanup``): the fleet becomes authoritative, and the way back until cleanup."""

from .back import adopt_abort, adopt_cleanup
from .baseline import BaselineResult, adopt_baseline
from .cutover import CutoverResult, adopt_cutover
from .plan import AdoptPlan, adopt_plan
from .verify import AdoptVerifyResult, adopt_verify

__all__ = [
    "AdoptPlan",
    "AdoptVerifyResult",
    "BaselineResult",
    "CutoverResult",
    "adopt_abort",
    "adopt_baseline",
    "adopt_cleanup",
    "adopt_cutover",
    "adopt_plan",
    "adopt_verify",
]
