"""Adopting one live PostgreSQL database into a fleet: ``plan`` (read-only: shard keys, blockers,
query classes) and ``baseline`` (the adopted tables' definitions as the fleet's first migration).
The copy, the old IDs, the verification and the cutover are not built yet (docs/adopting.md)."""

from .back import adopt_abort, adopt_cleanup
from .baseline import BaselineResult, adopt_baseline
from .cutover import CutoverResult, adopt_cutover
from .plan import AdoptPlan, adopt_plan

__all__ = [
    "AdoptPlan",
    "BaselineResult",
    "CutoverResult",
    "adopt_abort",
    "adopt_baseline",
    "adopt_cleanup",
    "adopt_cutover",
    "adopt_plan",
]
