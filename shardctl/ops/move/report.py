"""``MoveReport``: what one ``move-shard`` invocation did, as typed fields each phase fills in.

Its ``--json`` document (``to_dict``) has a key for each field that a phase set (a field still None
was not reached and is left out), so a prepare-only run shows no freeze figures; the report also reads
as that mapping (``report["freeze_seconds"]``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class MoveReport(Mapping):
    """The result of ``move_shards``, ``abort_move`` and ``cleanup_move``: the move, the phases run and
    the phase it is in now, and each phase's own figures. A phase that fails raises instead, naming
    the move's phase and how to resume or roll back; so does :meth:`raise_for_status` for a move that
    stopped short of the phases asked for (never, today)."""

    command: str = "move-shard"
    move_id: str | None = None
    shards: str = ""
    shard_count: int | None = None
    source: str = ""
    target: str = ""
    phases_run: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    phase: str = ""
    nothing_to_do: bool | None = None  # the shards are already on the target
    seconds: float = 0.0
    # preflight
    preflight_reach: bool | None = None
    preflight_trial: dict[str, Any] | None = None  # shard, migrations, skipped
    # prepare
    prepare_seconds: float | None = None
    prepare_streams: int | None = None
    prepare_drop_streams: int | None = None  # leftovers of an earlier try dropped in parallel
    # sync
    tables: int | None = None
    copied_bytes: int | None = None
    lag_bytes: int | None = None
    sync_seconds: float | None = None
    # cutover
    verify_before: str | None = None
    verify_before_seconds: float | None = None
    verify_before_busy_tables: int | None = None
    freeze_lock_seconds: float | None = None
    freeze_caught_up_seconds: float | None = None
    freeze_snapshot_seconds: float | None = None
    freeze_retired_seconds: float | None = None
    freeze_stubs_seconds: float | None = None
    freeze_started: float | None = None
    freeze_started_at: float | None = None
    sequences: int | None = None
    freeze_commit_seconds: float | None = None
    freeze_seconds: float | None = None  # cutover's write freeze, or abort's
    freeze_ended_at: float | None = None
    topology_flipped: bool | None = None
    rows: int | None = None  # rows compared
    verify_after_seconds: float | None = None
    verified: bool | None = None
    # abort and cleanup
    dropped: dict[str, Any] | None = None  # replication objects dropped
    abort_drop_streams: int | None = None
    cleanup_drop_streams: int | None = None
    # catch-up to the fleet's version
    fleet_version: int | None = None
    caught_up: dict[str, Any] | None = None
    # --nice
    nice: float | None = None
    rested_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc = {k: v for k, v in doc.items() if v is not None}
        if self.freeze_started is not None:
            # rows are compared after the freeze now: the key stays, with no time inside the freeze
            doc["freeze_compared_seconds"] = None
        return doc

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    @property
    def ok(self) -> bool:
        return True

    def raise_for_status(self) -> MoveReport:
        return self
