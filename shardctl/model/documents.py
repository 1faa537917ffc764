"""A result's JSON document (``to_dict()``, what ``--json`` prints), built one way for every result."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar


def result_doc(result: Any, *, omit: tuple[str, ...] = (), **values: Any) -> dict[str, Any]:
    """The document of the dataclass ``result``: first the ``values`` that name none of its fields
    (``command``, ``ok``…), then its fields in the order the class declares them, where a value given
    under a field's name replaces it and ``omit`` leaves one out. A field's own value goes through
    :func:`json_value`."""
    names = [f.name for f in dataclasses.fields(result) if f.name not in omit]
    doc = {key: value for key, value in values.items() if key not in names}
    for name in names:
        doc[name] = values[name] if name in values else json_value(getattr(result, name), name)
    return doc


def json_value(value: Any, name: str = "") -> Any:
    """``value`` as a document holds it: a result's own ``to_dict()``, a dataclass as a dict, a list
    item by item, and a duration (a float named ``seconds``) to the millisecond."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, list):
        return [json_value(item) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if name == "seconds" and isinstance(value, float):
        return round(value, 3)
    return value


class Result:
    """A result whose document is ``command`` (the class's), ``ok``, then its fields (:func:`result_doc`).
    The dataclass that derives from it defines ``ok``."""

    command: ClassVar[str] = ""
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return result_doc(self, command=self.command, ok=self.ok)
