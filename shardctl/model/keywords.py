"""Keyword arguments declared once, as a ``TypedDict``, by the functions that share them (PEP 692's
``**kwargs: Unpack[...]``): the one check that a call gave none but those."""

from __future__ import annotations

import sys
from typing import Any

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # pragma: no cover
    from typing_extensions import Unpack

__all__ = ["Unpack", "accepted", "keyword_names"]


def keyword_names(declared: type) -> frozenset[str]:
    """The keywords a ``TypedDict`` declares (its bases' included)."""
    return frozenset(declared.__annotations__)


def accepted(function: str, given: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """``given``, once every keyword in it is one of ``names`` (else Python's own TypeError, naming
    ``function`` as a call of it with that keyword would)."""
    unknown = sorted(set(given) - names)
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    return given
