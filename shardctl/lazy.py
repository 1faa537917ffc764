"""Names a package exports but imports on first use (PEP 562): the modules that define them pull in
psycopg, which the offline commands, and a command refused for bad input, never load."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name in ``modules`` (submodule → names) is
    imported from its submodule when first asked for; any other name is an AttributeError (so that
    ``from package import submodule`` still imports the submodule)."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f".{where[name]}", package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
