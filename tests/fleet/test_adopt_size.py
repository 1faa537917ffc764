"""``adopt copy`` at several hundred MB (slow suite): each app of tests/data/apps at 300 MB on the old
database, its plan's fixes run and keys changed by update, copied into a 2-host fleet while the app
goes on writing (new rows, keys changed by update). Judged by the old database itself: for every
sharded table and shard, the rows whose ``key % shard_count`` is that shard (count and a hash of
every row) are exactly the shard's table's rows on its host; global tables whole on the global host.
"""

from __future__ import annotations

import pytest
from support.apps import app_writes, caught_up, fleet_rows, prepare, source_rows
from support.fleet import load

from shardctl import adopt_copy
from shardctl.ops.provision import init

ROUTING = "routing:\n  key: user_id\n"
SHARDS = 16


@pytest.mark.slow
@pytest.mark.parametrize("app", ["forum_django", "tasks_prisma"])
def test_copy_at_size_puts_every_row_in_its_keys_shard(make_fleet, tmp_path, app):
    path = make_fleet(hosts=2, shards=SHARDS, extra=ROUTING)
    for f in (path.parent / "migrations").iterdir():
        f.unlink()  # the baseline is the fleet's first migration
    dsn = make_fleet.new_database(0)
    plan_file = tmp_path / "plan.yaml"
    plan = prepare(load(path), dsn, app, plan_file, mb=300)
    init(load(path)).raise_for_status()

    with app_writes(dsn, app, rate=20) as writes:
        adopt_copy(load(path), dsn, plan_file)
    assert writes["transactions"] > 0 and not writes["errors"], writes
    caught_up(dsn)

    want = source_rows(dsn, plan)
    assert {s for _, s in want} == set(range(SHARDS)) | {None}
    got = fleet_rows(load(path), plan)
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    extra = sorted(k for k in got if k not in want)
    assert not wrong and not extra, (sorted(wrong.items())[:6], extra[:6])
