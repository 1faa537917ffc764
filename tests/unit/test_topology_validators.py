"""The topology's section validators work alone: each is given the parsed document and a ``Problems``
sink, and returns its values (no validator depends on another's attributes)."""

from __future__ import annotations

import pytest

from shardctl.errors import ConfigErrors
from shardctl.model.topology import HostsValidator, Problems, _parse_yaml, lint_section


def hosts(text: str, count: int, allow_inline_password: bool = False):
    problems = Problems(None)
    validator = HostsValidator(
        problems, allow_inline_password=allow_inline_password, range_limit=count
    )
    return validator.validate(_parse_yaml(text), count), problems


def test_hosts_validator_returns_hosts_from_a_raw_mapping():
    found, problems = hosts(
        """hosts:
  - {name: a, dsn: "host=x dbname=a", shards: "0-3", pooler: session, max_jobs: 2}
  - {name: b, dsn: "host=y dbname=b", admin_dsn: "host=y2 dbname=b", shards: "4-7"}
""",
        8,
    )
    assert not problems.errors
    assert [(h.name, h.shards, h.pooler, h.max_jobs) for h in found] == [
        ("a", [0, 1, 2, 3], "session", 2),
        ("b", [4, 5, 6, 7], "transaction", None),
    ]
    assert found[1].dsn_for("admin") == "host=y2 dbname=b"


def test_hosts_validator_reports_each_problem_with_its_line():
    text = """hosts:
  - name: a
    dsn: "host=x dbname=a password=secret"
    shards: "0-3"
    pooler: bouncer
  - name: a
    dsn: "host=y dbname=b"
    shards: "3-5"
"""
    found, problems = hosts(text, 8)
    assert [(e.problem, e.line) for e in problems.errors] == [
        (
            (
                "host a: dsn contains a literal password; put it in an environment variable named by "
                "password_env (or pass --allow-inline-password)"
            ),
            3,
        ),
        (
            (
                "host a: pooler must be one of transaction, session, none (what the app dsn goes through; "
                "transaction is the safe default)"
            ),
            5,
        ),
        ("host name 'a' is used twice (first at line 2)", 6),
        ("shards 3 are owned by both a and a", 1),
        ("shards 6-7 are owned by no host (every shard 0..7 needs exactly one)", 1),
    ]
    assert [h.pooler for h in found] == ["transaction", "transaction"]  # a bad value is dropped
    with pytest.raises(ConfigErrors):
        problems.fail()
    _, allowed = hosts(text, 8, allow_inline_password=True)
    assert "literal password" not in " ".join(e.problem for e in allowed.errors)


def test_lint_section_alone():
    problems = Problems(None)
    doc = _parse_yaml("lint:\n  exclude: [ban-drop-column]\n  pg_version: 16\n")
    assert lint_section(problems, doc) == {
        "exclude": ["ban-drop-column"],
        "include": [],
        "pg_version": "16",
    }
    assert not problems.errors
