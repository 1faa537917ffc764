"""add-shard's bounds, checked by the library before any list of shards is built or any host is touched."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from shardctl.errors import BadInput
from shardctl.model.topology import Topology
from shardctl.ops.grow import new_shard_ids

TOPOLOGY = """\
version: 1
id:
  layout: custom
  bits: {time: 41, shard: 12, sequence: 10}
  epoch: "2020-01-01T00:00:00Z"
shards:
  count: 16
hosts:
  - name: pg1
    dsn: "postgresql://app@127.0.0.1:1/app"
    shards: "0-15"
"""


@pytest.fixture
def topo() -> Topology:
    return Topology.from_text(TOPOLOGY)


@pytest.mark.parametrize(
    "count,ids,needle",
    [
        (10**15, None, "--count 1000000000000000 goes beyond the custom layout's 12 shard bits"),
        (None, "16-99999999999999999", "--ids: shard 99999999999999999 is out of range"),
        (5, "16-20", "give either --count N or --ids RANGE"),
        (0, None, "--count must be positive"),
    ],
)
def test_bad_counts_cost_nothing(topo, count, ids, needle):
    tracemalloc.start()
    started = time.process_time()
    with pytest.raises(BadInput, match=needle.replace("(", r"\(")):
        new_shard_ids(topo, count, ids)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert time.process_time() - started < 0.5 and peak < 5_000_000


def test_good_counts_follow_on(topo):
    assert new_shard_ids(topo, 3, None) == [16, 17, 18]
    assert new_shard_ids(topo, None, "16-17") == [16, 17]
    assert len(new_shard_ids(topo, 4096 - 16, None)) == 4080
