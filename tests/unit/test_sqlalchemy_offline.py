"""shardctl.sqlalchemy without a server: the core never imports SQLAlchemy, and WHERE clauses route."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardctl import Router, Topology

TOPOLOGY = """\
version: 1
id:
  layout: instagram
  epoch: "2026-01-01T00:00:00Z"
shards:
  count: 16
hosts:
  - name: pg1
    dsn: "postgresql://app@127.0.0.1:1/app"
    shards: "0-7"
  - name: pg2
    dsn: "postgresql://app@127.0.0.1:1/app2"
    shards: "8-15"
"""


def test_the_core_does_not_import_sqlalchemy():
    code = (
        "import sys, shardctl, shardctl.router, shardctl.cli; "
        "assert 'sqlalchemy' not in sys.modules, sorted(m for m in sys.modules if 'sqlalchemy' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_sync_sessions_do_not_need_greenlet():
    """shardctl[sqlalchemy] without greenlet: shardctl.sqlalchemy imports and loads nothing of SQLAlchemy's
    asyncio layer, which only shardctl.sqlalchemy.asyncio (the sqlalchemy-asyncio extra) uses."""
    pytest.importorskip("sqlalchemy")
    code = (
        "import sys; sys.modules['greenlet'] = None\n"
        "import shardctl.sqlalchemy\n"
        "assert 'sqlalchemy.ext.asyncio' not in sys.modules\n"
        "assert 'shardctl.sqlalchemy.asyncio' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_where_clauses_route_by_key_and_id(tmp_path):
    sa = pytest.importorskip("sqlalchemy")
    from shardctl.sqlalchemy import criterion_shards

    path = tmp_path / "shardctl.yaml"
    path.write_text(TOPOLOGY)
    topo = Topology.load(path)
    photos = sa.Table(
        "photos",
        sa.MetaData(),
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("user_id", sa.BigInteger),
        sa.Column("caption", sa.Text),
    )
    tables = {photos: {"id": True, "user_id": False}}
    c = photos.c
    an_id = topo.layout.encode(shard=9, time=1000)
    with Router(topo) as router:

        def shards(clause, params=None):
            return criterion_shards(router, clause, tables, params or {})

        assert shards(c.user_id == 3) == {3}
        assert shards(c.user_id.in_([1, 17, 30])) == {1, 14}
        assert shards((c.user_id == 2) | (c.user_id == 5)) == {2, 5}
        assert shards(sa.and_(c.user_id.in_([1, 2]), c.user_id == 2)) == {2}
        assert shards(sa.and_(c.user_id == 4, c.caption == "x")) == {4}
        assert shards((c.user_id == 2) | (c.caption == "x")) is None
        assert shards(c.caption == "x") is None and shards(None) is None
        assert shards(c.user_id == sa.bindparam("k"), {"k": 20}) == {4}
        assert shards(c.id == an_id) == {9} and shards(c.id.in_([an_id, an_id + 1])) == {9}


def test_the_docs_show_the_fastapi_example_in_full():
    """docs/orms.md's FastAPI block is examples/fastapi_app/main.py, as it is (the test that runs the
    app runs what the docs show)."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "orms.md").read_text()
    block = text.split("<!-- example: fastapi-app -->\n```python\n", 1)[1].split("```\n", 1)[0]
    assert block == (root / "examples" / "fastapi_app" / "main.py").read_text()
