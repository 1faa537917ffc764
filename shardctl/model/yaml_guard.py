"""Limits a topology file must meet before it is loaded, and the fast load of a plain one.

A few hundred bytes of YAML can stand for billions of nodes ("billion laughs": aliases of
aliases), and ruamel's round-trip loader needs about 50 µs per node. So the text is first
walked as a stream of parse events, by libyaml's C parser when PyYAML has it (about 1 µs an
event), counting every node as if each alias were expanded, and refused at the first limit
it crosses. Only text within the limits is loaded, so loading stays under a second.

The same walk feeds :class:`.yaml_doc.Builder`, which builds the document of a plain topology
from those events (:func:`checked_document`); anything else is loaded by ruamel.

The limits (documented in docs/topology.md, Input limits) are far above any real topology: a fleet of a
thousand hosts with standbys and passwords is about 11,000 nodes and 150 KB.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import LimitExceeded
from .ranges import MAX_SHARDS  # noqa: F401 - shards.count and every shard number stay below it
from .yaml_doc import NOT_BUILT, Builder

MAX_BYTES = 256 * 1024  # the topology file, checked before it is read
MAX_NODES = 12_288  # YAML nodes, each alias counted as the nodes it stands for
MAX_SCALAR_CHARS = 4096  # one key or value (a DSN, a range, a path)
MAX_DEPTH = 32  # nesting of mappings and lists
MAX_HOSTS = 1024  # entries under hosts:


def read_limited(path: Any) -> str:
    """Read a topology file of at most :data:`MAX_BYTES` (never more than that many bytes are read)."""
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise LimitExceeded(
            f"the topology file is larger than {MAX_BYTES // 1024} KiB (the limit; "
            f"a real topology is a few KB)"
        )
    return data.decode("utf-8")


def checked_document(text: str, build: bool = True) -> Any:
    """LimitExceeded if ``text`` crosses a limit (syntax errors are left to the loader, which reports
    them with its own words); else the document of ``text`` built from the same libyaml events when
    :class:`.yaml_doc.Builder` is sure it is the one ruamel's round-trip loader would return;
    otherwise (or with ``build`` False) :data:`.yaml_doc.NOT_BUILT`: load the text with ruamel."""
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise LimitExceeded(
            f"the topology is larger than {MAX_BYTES // 1024} KiB (the limit; "
            f"a real topology is a few KB)"
        )
    builder = Builder(text) if build else None
    try:
        _walk(_fast_events(text), builder)
    except LimitExceeded:
        raise
    except Exception:  # noqa: BLE001 - libyaml refused the text; ruamel's own parser decides
        try:
            _walk(_ruamel_events(text))
        except LimitExceeded:
            raise
        except Exception:  # noqa: BLE001, S110 - a syntax error: the loader reports it with its line
            pass
        return NOT_BUILT
    return builder.document() if builder is not None else NOT_BUILT


def _fast_events(text: str) -> Iterator[Any]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader
    return yaml.parse(text, Loader=loader)


def _ruamel_events(text: str) -> Iterator[Any]:
    from ruamel.yaml import YAML

    return YAML(typ="rt").parse(text)


def _line(event: Any) -> int | None:
    mark = getattr(event, "start_mark", None)
    return mark.line + 1 if mark is not None else None


def _walk(events: Iterator[Any], builder: Builder | None = None) -> None:
    """Count nodes (aliases expanded) and check sizes, stopping at the first limit crossed;
    ``builder`` is fed each event until it gives up."""
    sizes: dict[str, int] = {}  # anchor → nodes it stands for, once its node is complete
    # anchors of collections still being read (an alias to one is a cycle)
    open_anchors: set[str] = set()
    stack: list[_Open] = []
    total = 0
    for event in events:
        kind = type(event).__name__
        if builder is not None and builder.ok:
            builder.feed(kind, event)
        if kind in ("ScalarEvent", "AliasEvent", "MappingStartEvent", "SequenceStartEvent"):
            if kind == "AliasEvent":
                if event.anchor in open_anchors:
                    raise LimitExceeded(
                        f"alias *{event.anchor} refers to a node that contains it", _line(event)
                    )
                n = sizes.get(event.anchor, 1)
            else:
                n = 1
                if kind == "ScalarEvent" and len(event.value) > MAX_SCALAR_CHARS:
                    raise LimitExceeded(
                        f"a value of {len(event.value)} characters (at most {MAX_SCALAR_CHARS})",
                        _line(event),
                    )
            total += n
            if total > MAX_NODES:
                raise LimitExceeded(
                    f"the topology has more than {MAX_NODES} YAML nodes"
                    f"{' once its aliases are expanded' if kind == 'AliasEvent' else ''} "
                    f"(the limit; a thousand hosts with standbys need about 11,000)",
                    _line(event),
                )
            hosts_list = bool(stack) and stack[-1].child(event, n) and len(stack) == 1
            if kind.endswith("StartEvent"):
                if len(stack) >= MAX_DEPTH:
                    raise LimitExceeded(
                        f"the topology nests deeper than {MAX_DEPTH} levels", _line(event)
                    )
                stack.append(_Open(event.anchor, kind == "MappingStartEvent", hosts_list))
                if event.anchor:
                    open_anchors.add(event.anchor)
            elif kind == "ScalarEvent" and event.anchor:
                sizes[event.anchor] = 1
        elif kind in ("MappingEndEvent", "SequenceEndEvent") and stack:
            done = stack.pop()
            if stack:
                stack[-1].inner += done.inner
            if done.anchor:
                open_anchors.discard(done.anchor)
                sizes[done.anchor] = 1 + done.inner


class _Open:
    """A mapping or list being read: its anchor, nodes inside so far, and (for the top-level
    mapping) which key a value belongs to, so the hosts list is counted as it is read."""

    __slots__ = ("anchor", "hosts", "inner", "items", "key", "key_next", "mapping")

    def __init__(self, anchor: str | None, mapping: bool, hosts: bool):
        self.anchor, self.inner, self.mapping, self.hosts = anchor, 0, mapping, hosts
        self.items, self.key_next, self.key = 0, True, None

    def child(self, event: Any, nodes: int) -> bool:
        """Account for a child node; True when it is the value of a ``hosts`` key."""
        self.inner += nodes
        if not self.mapping:
            self.items += 1
            if self.hosts and self.items > MAX_HOSTS:
                raise LimitExceeded(
                    f"'hosts' lists more than {MAX_HOSTS} hosts (the limit)", _line(event)
                )
            return False
        is_key, self.key_next = self.key_next, not self.key_next
        if is_key:
            self.key = getattr(event, "value", None)
            return False
        return self.key == "hosts"
