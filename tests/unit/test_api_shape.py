"""The library API has one shape: every fleet operation exported by ``shardctl`` takes a Topology first
and is annotated to return a result type with ``ok``, ``to_dict()`` and ``raise_for_status()``; every name
in ``__all__`` resolves; the docs' library API section lists every operation."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pytest

import shardctl

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def test_every_exported_name_resolves():
    assert sorted(set(shardctl.__all__)) == sorted(shardctl.__all__)
    for name in shardctl.__all__:
        assert getattr(shardctl, name) is not None, name


def test_every_operation_takes_a_topology_and_returns_a_typed_result():
    for name in shardctl._OPERATIONS:
        func = getattr(shardctl, name)
        hints = typing.get_type_hints(func)
        first = next(iter(inspect.signature(func).parameters))
        assert (
            shardctl.Topology in typing.get_args(hints[first]) or hints[first] is shardctl.Topology
        ), (
            name,
            hints[first],
        )
        result = hints["return"]
        assert result is not dict and inspect.isclass(result), (name, result)
        for member in ("ok", "to_dict", "raise_for_status"):
            assert hasattr(result, member), (name, result, member)
        assert name in shardctl.__all__
        assert result.__name__ in shardctl.__all__, (name, result)


def test_the_docs_list_every_operation_and_its_result():
    text = DOCS.read_text()
    section = text.split("## Library API", 1)[1].split("\n## ", 1)[0]
    for name in shardctl._OPERATIONS:
        result = typing.get_type_hints(getattr(shardctl, name))["return"]
        assert f"`{name}(" in section, name
        assert f"`{result.__name__}`" in section, (name, result.__name__)


def test_abort_and_cleanup_take_only_the_recorded_moves_keywords():
    """``abort_move`` and ``cleanup_move`` take the recorded move's keywords, keyword-only: a misspelt one
    is Python's own TypeError, before any host is reached (this topology's hosts do not exist)."""
    from shardctl.ops.move import abort_move, cleanup_move

    topo = shardctl.Topology.from_text(
        "version: 1\n"
        "id: {layout: instagram, epoch: '2020-01-01T00:00:00Z'}\n"
        "shards: {count: 4}\n"
        "hosts:\n"
        "  - {name: pg1, dsn: 'postgresql://app@127.0.0.1:1/app', shards: '0-3'}\n"
    )
    for func in (abort_move, cleanup_move):
        params = list(inspect.signature(func).parameters.values())[1:]
        assert [p.name for p in params] == ["shards", "move_id", "options", "progress"]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), func
        name = func.__name__
        with pytest.raises(
            TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'shard'$"
        ):
            func(topo, shard=[1])


# Each Router call's keywords besides its positional ones, all keyword-only (no **kwargs).
ROUTING = ["id", "shard", "force_string", "table", "global_"]
ROUTER_CALLS = {
    "target": (["key"], ROUTING),
    "resolve": (["key"], ROUTING),
    "connection": (["key"], [*ROUTING, "timeout", "readonly", "max_lag"]),
    "run": (["key", "work"], [*ROUTING, "timeout"]),
    "execute": (["key", "query", "params"], [*ROUTING, "timeout"]),
    "read": (["key", "query", "params"], [*ROUTING, "timeout", "max_lag"]),
}


def test_the_routers_calls_take_plain_keyword_only_arguments():
    """Both Routers' calls, and the Django integration's, name their keywords in their signatures: a
    misspelt one is Python's own TypeError, raised before anything is routed or connected (this
    topology's hosts do not exist)."""
    from shardctl.django import context
    from shardctl.router import AsyncRouter, Router

    topo = shardctl.Topology.from_text(
        "version: 1\n"
        "id: {layout: instagram, epoch: '2020-01-01T00:00:00Z'}\n"
        "shards: {count: 4}\n"
        "hosts:\n"
        "  - {name: pg1, dsn: 'postgresql://app@127.0.0.1:1/app', shards: '0-3'}\n"
    )
    for cls in (Router, AsyncRouter):
        router = cls(topo)
        for name, (positional, keywords) in ROUTER_CALLS.items():
            params = list(inspect.signature(getattr(cls, name)).parameters.values())[1:]
            assert [p.name for p in params] == positional + keywords, (cls, name)
            kinds = [p.kind for p in params]
            assert kinds == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * len(positional) + [
                inspect.Parameter.KEYWORD_ONLY
            ] * len(keywords), (cls, name)
            qualname = getattr(cls, name).__qualname__
            assert qualname == f"{cls.__name__}.{name}" or name == "target", qualname
            if name == "resolve" and cls is AsyncRouter:
                continue  # a coroutine: its TypeError is raised when it is called, the same
            for misspelt in ("shrad", "max_lga"):
                with pytest.raises(
                    TypeError,
                    match=rf"^{re.escape(qualname)}\(\) got an unexpected keyword argument '{misspelt}'$",
                ):
                    getattr(router, name)(1, **{misspelt: 1})
        assert router._pools == {}
    for func in (context.target, context.on_shard):
        params = list(inspect.signature(func).parameters.values())
        assert [p.name for p in params] == ["key", *ROUTING], func
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:]), func
        with pytest.raises(
            TypeError, match=rf"^{func.__name__}\(\) got an unexpected keyword argument 'shrad'$"
        ):
            func(shrad=1)
