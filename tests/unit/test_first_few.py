"""``errors.first_few``: how a one-line message names the first few of many problems."""

from __future__ import annotations

from shardctl.errors import first_few


def test_all_shown_when_few():
    assert first_few(["a", "b"], 3) == "a; b"
    assert first_few(["a"], 1) == "a"


def test_the_rest_is_counted():
    assert first_few(["a", "b", "c", "d", "e"], 3) == "a; b; c (and 2 more)"
    assert first_few(["a", "b"], 1) == "a (and 1 more)"


def test_say_sep_and_more():
    items = [{"n": 1}, {"n": 2}, {"n": 3}]
    assert first_few(items, 2, lambda i: f"#{i['n']}", sep=", ") == "#1, #2 (and 1 more)"
    assert first_few(["x", "y"], 1, more="more shards") == "x (and 1 more shards)"


def test_say_runs_only_on_the_shown():
    said = []
    first_few(list(range(1000)), 2, lambda i: said.append(i) or str(i))
    assert said == [0, 1]
