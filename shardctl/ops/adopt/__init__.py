"""Adopting one live PostgreSQL database into a fleet: ``plan`` (read-only: shard keys, blockers,
query classes) and ``baseline`` (the adopted tables' definitions as the fleet's first migration).
``verify``: each shard's rows against the source's, and dark reads. The copy, the old IDs and the
cutover are not built yet (docs/adopting.md)."""

from .baseline import BaselineResult, adopt_baseline
from .plan import AdoptPlan, adopt_plan
from .verify import AdoptVerifyResult, adopt_verify

__all__ = [
    "AdoptPlan",
    "AdoptVerifyResult",
    "BaselineResult",
    "adopt_baseline",
    "adopt_plan",
    "adopt_verify",
]
