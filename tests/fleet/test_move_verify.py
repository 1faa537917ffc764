"""A move whose copy differs from the source never goes unnoticed (issue 12, item 1): the check before the
freeze (row counts by default, checksums with ``--verify-before full``) stops it while the source is still
authoritative, and the comparison of every row after the cutover catches what counts cannot see; then
``--abort`` goes back."""

from __future__ import annotations

import pytest
from support.fleet import connect, load

from shardctl.errors import OperationFailed
from shardctl.ops.move import MoveOptions, abort_move, move_shards, transfer
from shardctl.ops.move.run import Pacer


def tamper_target(path, sql: str) -> None:
    move_shards(load(path), [4, 5], "pg2", phases=["prepare", "sync"])
    with connect(load(path), "pg2", autocommit=True) as conn:
        conn.execute(sql)


def captions(path, host: str, schema: str) -> list[str]:
    with connect(load(path), host) as conn:
        return [
            r[0]
            for r in conn.execute(f"SELECT caption FROM {schema}.photos ORDER BY id").fetchall()
        ]


def source_still_serves(path) -> None:
    topo = load(path)
    assert topo.host_of(4).name == "pg1"
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("INSERT INTO insta4.photos (user_id, caption) VALUES (4, 'still writable')")


def test_rows_missing_on_the_target_stop_the_move_before_the_freeze(fleet3):
    tamper_target(
        fleet3,
        "DELETE FROM insta4.photos WHERE id IN (SELECT id FROM insta4.photos ORDER BY id LIMIT 3)",
    )
    with pytest.raises(
        OperationFailed,
        match=r"1 table\(s\) differ between the hosts though unchanged on the "
        r"source, e\.g\. insta4\.photos: 150 rows on pg1, 147 on pg2; "
        r"nothing was switched",
    ):
        move_shards(load(fleet3), [4, 5], "pg2", phases=["cutover"])
    source_still_serves(fleet3)
    abort_move(load(fleet3), shards=[4, 5])
    assert len(captions(fleet3, "pg1", "insta4")) == 151


@pytest.mark.parametrize("nice", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_changed_value_passes_the_counts_and_is_caught_after_the_cutover(fleet3, nice):
    tamper_target(
        fleet3,
        "UPDATE insta4.photos SET caption = 'tampered' WHERE id = (SELECT min(id) FROM insta4.photos)",
    )
    with pytest.raises(
        OperationFailed,
        match=r"verify after the cutover: 1 table\(s\) differ between pg1 \(frozen\) "
        r"and pg2 as of the cutover, e\.g\. insta4\.photos: .*--abort",
    ):
        move_shards(load(fleet3), [4, 5], "pg2", phases=["cutover"], options=MoveOptions(nice=nice))
    assert (
        load(fleet3).host_of(4).name == "pg2"
    )  # the target serves the shards: the check came after the switch
    abort_move(load(fleet3), shards=[4, 5])  # copies the (authoritative) target's rows back
    source_still_serves(fleet3)
    assert len(captions(fleet3, "pg1", "insta4")) == 151


def test_verify_before_full_catches_the_changed_value_before_the_freeze(fleet3):
    tamper_target(
        fleet3,
        "UPDATE insta4.photos SET caption = 'tampered' WHERE id = (SELECT min(id) FROM insta4.photos)",
    )
    with pytest.raises(
        OperationFailed,
        match=r"differ between the hosts though unchanged on the source, "
        r"e\.g\. insta4\.photos: 150 rows on pg1, 150 on pg2",
    ):
        move_shards(
            load(fleet3),
            [4, 5],
            "pg2",
            phases=["cutover"],
            options=MoveOptions(verify_before="full"),
        )
    source_still_serves(fleet3)
    abort_move(load(fleet3), shards=[4, 5])


def test_a_nice_move_rests_between_its_units_of_work_and_still_compares_every_row(
    fleet3, monkeypatch
):
    """``--nice``: the copy rests after each PAUSE_BYTES (made tiny here), the checks after each few tables;
    the report says how long the workers rested; the rows all arrive and are compared."""
    rests: list[float] = []
    real_rest = Pacer.rest

    def counted(self: Pacer) -> None:
        before = self.rested
        real_rest(self)
        rests.append(self.rested - before)

    monkeypatch.setattr(transfer, "PAUSE_BYTES", 256)
    monkeypatch.setattr(Pacer, "rest", counted)
    before = {s: captions(fleet3, "pg1", s) for s in ("insta4", "insta5")}
    report = move_shards(load(fleet3), [4, 5], "pg2", options=MoveOptions(nice=1))
    assert report["verified"] is True and report["rows"] >= 300
    assert {s: captions(fleet3, "pg2", s) for s in before} == before
    assert len(rests) >= 20, (
        rests
    )  # the copy's ~KB of rows in 256-byte units, and the checks' chunks
    assert report["nice"] == 1 and report["rested_seconds"] == pytest.approx(sum(rests), abs=0.01)
    assert 0 < report["rested_seconds"] < report["seconds"]
