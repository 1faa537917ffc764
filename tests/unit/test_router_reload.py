"""Router.reload parses the topology file only when it changed (no server needed)."""

from __future__ import annotations

import os

from shardctl import Router, Topology

TOPOLOGY = """\
version: 1
id:
  layout: instagram
  epoch: "2026-01-01T00:00:00Z"
shards:
  count: 8
hosts:
  - name: pg1
    dsn: "postgresql://app@127.0.0.1:1/app"
    shards: "0-3"
  - name: pg2
    dsn: "postgresql://app@127.0.0.1:1/app2"
    shards: "4-7"
"""


def test_an_unchanged_file_is_not_parsed_again(tmp_path):
    path = tmp_path / "shardctl.yaml"
    path.write_text(TOPOLOGY)
    with Router(Topology.load(path)) as router:
        first = router.reload()
        assert router.reload() is first and router.reload() is first  # same file: the same object
        flipped = (
            tmp_path / "shardctl.yaml.new"
        )  # how shardctl writes it: a new file renamed over the old
        flipped.write_text(
            TOPOLOGY.replace('shards: "0-3"', 'shards: "0-2"').replace('"4-7"', '"3-7"')
        )
        os.replace(flipped, path)
        fresh = router.reload()
        assert fresh is not first and fresh.host_of(3).name == "pg2"
        assert router.reload() is fresh
