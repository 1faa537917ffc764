"""A topology document built straight from libyaml's parse events: the read path's fast loader.

:mod:`.yaml_guard` already walks libyaml's events to enforce its limits. For the plain text a real
topology is (mappings, lists, strings, small decimal integers), the same events are enough to build
the document the round-trip loader (ruamel, YAML 1.2) would return, with the line of every node, key
and item, without importing ruamel (about 13 ms) or running it (about 9 ms for a small topology).

The builder gives up -- and the caller loads the text with ruamel -- at anything it is not
sure to read exactly like ruamel: anchors, aliases, tags, directives, several documents, a key that
is a list or a mapping, a duplicate key (ruamel reports it in its own words), block or multi-line
scalars, escapes, text that is not printable ASCII, and every plain (unquoted) scalar that ruamel's
YAML 1.2 resolver could read as anything but a string or a decimal integer: ``true``, ``null``,
``~``, ``<<``, ``=``, an empty value, ``1.5``, ``0x1F``, ``007``, ``1_000``, ``2026-01-01``...
``tests/unit/test_yaml_doc.py`` loads a corpus both ways and compares every value and line.
"""

from __future__ import annotations

from typing import Any

NOT_BUILT: Any = object()  # the builder gave up: load the text with ruamel

# First characters of the plain scalars ruamel's YAML 1.2 implicit resolvers may claim (bool: tTfF;
# float, int, timestamp: sign, dot, digits; merge <; null ~ n N and ""; value =; the never-matching
# "yaml" resolver ! & *). A plain scalar starting with any other character is a string.
_RESOLVED_FIRST = frozenset("tTfFnN~<=!&*-+.0123456789")
_WORDS = frozenset(
    {"true", "True", "TRUE", "false", "False", "FALSE", "null", "Null", "NULL", "~", "<<", "="}
)
# Every character a YAML 1.2 float, int or timestamp can contain: a plain scalar with any other
# character cannot be one of them.
_NUMBER_CHARS = frozenset("0123456789_.+-eEboxXabcdefABCDEFinfINFaN:TtZ \t")
# longer decimal integers go to ruamel (Python's int() refuses over 4300 digits)
_MAX_INT_DIGITS = 20


class LineCol:
    """Where a node and its keys or items start (0-based line and column), read like ruamel's ``.lc``."""

    __slots__ = ("col", "data", "line")

    def __init__(self, line: int, col: int, data: Any):
        self.line, self.col, self.data = line, col, data

    def key(self, key: Any) -> tuple[int, int]:
        """(line, column) of ``key``; KeyError if the mapping has no such key."""
        return self.data[key][:2]

    def item(self, index: int) -> tuple[int, int]:
        """(line, column) of item ``index``; IndexError past the end."""
        return self.data[index]


class Mapping(dict):
    """A mapping of the document, in file order, with ``lc`` (see :class:`LineCol`)."""

    __slots__ = ("lc",)


class Sequence(list):
    """A list of the document, with ``lc`` (see :class:`LineCol`)."""

    __slots__ = ("lc",)


def plain_scalar(value: str) -> Any:
    """What ruamel's round-trip loader makes of the plain scalar ``value``: the string itself or a
    decimal int; :data:`NOT_BUILT` when it could be anything else (or an int ruamel wraps)."""
    if not value:
        return NOT_BUILT  # null
    if value[0] not in _RESOLVED_FIRST:
        return value
    if value in _WORDS or value[0] in "!&*":
        return NOT_BUILT
    if value[0] in "tTfFnN~<=":
        return value  # only the words above resolve
    if value.isdigit():  # ASCII only: the builder refuses other text
        # "0", "007": ruamel returns a ScalarInt (it keeps the width); give those to ruamel.
        return int(value) if value[0] != "0" and len(value) <= _MAX_INT_DIGITS else NOT_BUILT
    if value.count("-") == 1 and all(p.isdigit() for p in value.split("-")):
        return (
            value  # a shard range such as 0-31: a single inner dash matches no number or timestamp
        )
    if any(c not in _NUMBER_CHARS for c in value):
        return value
    return NOT_BUILT


class Builder:
    """Fed every parse event by :func:`.yaml_guard.checked_document`; :meth:`document` is the result."""

    __slots__ = ("documents", "flow", "key", "ok", "root", "stack", "text")

    def __init__(self, text: str):
        self.text = text
        # Tabs, carriage returns, control and non-ASCII characters: YAML 1.1 (libyaml) and 1.2 (ruamel)
        # differ in corners there; such text goes to ruamel.
        self.ok = text.isascii() and text.replace("\n", "").isprintable()
        self.root: Any = NOT_BUILT
        self.stack: list[Any] = []  # open mappings and lists
        self.key: list[Any] = []  # per open collection: its pending key (a mapping's), or NOT_BUILT
        self.flow: list[bool] = []  # per open collection: whether it is a flow one ([...] or {...})
        self.documents = 0

    def document(self) -> Any:
        """The document, or :data:`NOT_BUILT` if the builder gave up."""
        return self.root if self.ok and not self.stack else NOT_BUILT

    def feed(self, kind: str, event: Any) -> None:
        """Take one event (``kind`` is its class name); on anything unsure, give up (``ok`` False)."""
        if kind == "ScalarEvent":
            value = self._scalar(event)
            if value is not NOT_BUILT:
                self._add(value, event, False)
                return
        elif kind in ("MappingStartEvent", "SequenceStartEvent"):
            if event.anchor is None and event.tag is None:
                mark = event.start_mark
                mapping = kind == "MappingStartEvent"
                node = Mapping() if mapping else Sequence()
                node.lc = LineCol(mark.line, mark.column, {} if mapping else [])
                if self._add(node, event, True):
                    self.stack.append(node)
                    self.key.append(NOT_BUILT)
                    self.flow.append(bool(event.flow_style))
                return
        elif kind in ("MappingEndEvent", "SequenceEndEvent"):
            self.stack.pop()
            self.key.pop()
            self.flow.pop()
            return
        elif kind == "DocumentStartEvent":
            self.documents += 1
            if self.documents == 1 and event.version is None and not event.tags:
                return
        elif kind in ("StreamStartEvent", "StreamEndEvent", "DocumentEndEvent"):
            return
        # an alias, an anchor or tag, a directive, a second document, an unsure scalar
        self.ok = False

    def _scalar(self, event: Any) -> Any:
        if event.anchor is not None or event.tag is not None:
            return NOT_BUILT
        start, end = event.start_mark.index, event.end_mark.index
        if event.style == "":
            if ":" in event.value and True in self.flow:
                return (
                    NOT_BUILT  # "a:b" inside [...] or {...}: a corner where YAML 1.1 and 1.2 part
                )
            if self.text[start:end] != event.value:
                return NOT_BUILT  # folded over several lines
            return plain_scalar(event.value)
        if event.style in ("'", '"') and self.text[start + 1 : end - 1] == event.value:
            return event.value  # one line, no escapes: the same string for any YAML reader
        return NOT_BUILT

    def _add(self, value: Any, event: Any, collection: bool) -> bool:
        """Put ``value`` into the open collection (or make it the root); False if the builder gave up."""
        mark = event.start_mark
        if not self.stack:
            self.root = value
            return True
        parent = self.stack[-1]
        if isinstance(parent, Sequence):
            parent.append(value)
            parent.lc.data.append((mark.line, mark.column))
            return True
        key = self.key[-1]
        if key is NOT_BUILT:  # ``value`` is a key
            if collection or value in parent:  # a list or mapping as a key; a duplicate key
                self.ok = False
                return False
            self.key[-1] = (value, mark.line, mark.column)
            return True
        name, line, column = key
        parent[name] = value
        parent.lc.data[name] = (line, column, mark.line, mark.column)
        self.key[-1] = NOT_BUILT
        return True
