"""``move-shard`` and ``rebalance``."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from ..errors import BadInput, ShardctlError
from ..ops.move.state import PHASE_NAMES, Phase
from . import cli, json_option, settings
from .options import connect_timeout_option, finish, option_group, wait_option
from .output import flagged, info, stderr, stdout, table
from .params import AsciiFloat, AsciiInt, choice_option, flag_option, shown_option

if TYPE_CHECKING:
    from ..model.topology import Topology
    from ..ops.move import MoveOptions

# A move's tuning (freeze, copy, batches, subscriptions) and its connection: move-shard and rebalance.
move_options = option_group(
    json_option,
    shown_option(
        "--max-freeze",
        AsciiFloat(0.1, 3600),
        5.0,
        "Seconds writes may be frozen at cutover; past it the attempt is rolled back.",
    ),
    shown_option("--attempts", AsciiInt(1, 100), 3, "Cutover freezes to try before giving up."),
    shown_option(
        "--sequence-margin",
        AsciiInt(0, 1 << 40),
        1024,
        "Added to each source sequence's value when it is set on the target.",
    ),
    shown_option(
        "--schemas-per-subscription",
        AsciiInt(1, 100_000),
        64,
        "Schemas per publication / subscription.",
    ),
    shown_option(
        "--max-subscriptions",
        AsciiInt(1, 64),
        4,
        "Cap on subscriptions per move (batches grow instead).",
    ),
    shown_option(
        "--sync-timeout",
        AsciiFloat(1, 7 * 86_400),
        3600,
        "Seconds to wait for the initial copy (it goes on if this run stops).",
    ),
    click.option(
        "--publisher-dsn",
        metavar="DSN",
        help="How the target server reaches the source, if not by the topology's DSN "
        "(the source's password_env still supplies the password).",
    ),
    shown_option(
        "--copy-workers",
        AsciiInt(0, 4),
        4,
        "Parallel table copies of the initial copy, as of one snapshot per subscription "
        "(0: the subscriptions' table-sync workers copy).",
    ),
    choice_option(
        "--verify-before",
        ["counts", "full"],
        "The check before the freeze: row counts per table, or checksums of every row "
        "(every row is compared after the cutover either way).",
    ),
    shown_option(
        "--nice",
        AsciiFloat(0, 100),
        0,
        "Rest RATIO seconds after each second of the copy and the checks, leaving the "
        "hosts' CPU to the application (1: the move runs half the time).",
        metavar="RATIO",
    ),
    shown_option(
        "--batch-size",
        AsciiInt(1, 10_000),
        16,
        "Shards per transaction when creating or dropping schemas.",
    ),
    wait_option,
    connect_timeout_option,
)


def _options(kw: dict) -> MoveOptions:
    """MoveOptions from ``move_options``' parameters, each named as the field it sets."""
    from ..ops.move import MoveOptions

    return MoveOptions(**kw, allow_inline_password=settings().allow_inline_password)


@contextmanager
def move_progress(enabled: bool) -> Iterator[Callable[[str, int, int, str], None] | None]:
    """Progress of a move: rich bars on a terminal, else a line now and then on stderr."""
    if not enabled:
        yield None
        return
    if stderr.is_terminal:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=stderr,
        ) as bar:
            tasks: dict[str, int] = {}

            def tick(step: str, done: int, total: int, note: str) -> None:
                if step == "note":
                    bar.console.print(note, markup=False, highlight=False)
                    return
                if step not in tasks:
                    tasks[step] = bar.add_task(step, total=total or None, note=note)
                bar.update(tasks[step], completed=done, total=total or None, note=note)

            yield tick
        return
    yield plain_progress()


def plain_progress() -> Callable[[str, int, int, str], None]:
    """Progress as plain lines on stderr (no terminal). A counted step prints now and then (every 5 s,
    and when it finishes); an uncounted one (the freeze's locking, waiting for lag 0…) prints each
    new stage at once, and a changing measure within a stage (a lag shrinking) every 5 s."""
    last: dict[str, tuple] = {}

    def plain(step: str, done: int, total: int, note: str) -> None:
        if step == "note":
            info(note)
            return
        now = time.monotonic()
        # a step may be counted at one point, uncounted at another
        seen = last.get(f"{step}/{bool(total)}")
        if total:
            finished = done >= total
            if seen and (seen[1] == done or (now - seen[0] < 5 and not finished)):
                return
            last[f"{step}/True"] = (now, done)
            info(f"{step}: {done}/{total}{' ' + note if note else ''}")
            return
        # "lag 3 MB" and "lag 12 kB": one stage
        stage = re.sub(r"[0-9][0-9.,]*\s*[A-Za-z]*", "#", note)
        if seen and (seen[1] == note or (seen[2] == stage and now - seen[0] < 5)):
            return
        last[f"{step}/False"] = (now, note, stage)
        info(f"{step}: {note}")

    return plain


def _human_move(doc: dict) -> None:
    if doc.get("nothing_to_do"):
        for message in doc.get("messages") or []:
            stdout.print(message[0].upper() + message[1:] + ".", markup=False, highlight=False)
        return
    phases = ", ".join(doc.get("phases_run") or []) or "nothing"
    stdout.print(
        f"move {doc.get('move_id', '-')}: shards {doc.get('shards')} "
        f"{doc.get('source', '?')} → {doc.get('target', '?')}; ran {phases}; phase now "
        f"[bold]{doc.get('phase')}[/bold]",
        markup=True,
        highlight=False,
    )
    for message in doc.get("messages") or []:
        stdout.print(f"  {message}", markup=False, highlight=False)
    if "sync_seconds" in doc:
        stdout.print(
            f"  initial copy: {doc.get('tables', '?')} tables ready in {doc['sync_seconds']:.1f}s"
        )
    if "freeze_seconds" in doc:
        details = []
        if "rows" in doc:
            details.append(f"{doc['rows']} rows compared")
        if "sequences" in doc:
            details.append(f"{doc['sequences']} sequences copied")
        stdout.print(
            f"  write freeze: {doc['freeze_seconds']:.3f}s"
            + (f" ({', '.join(details)})" if details else "")
        )
    rested = (
        f" (resting {doc['rested_seconds']:.1f}s of the workers' time: --nice {doc['nice']:g})"
        if doc.get("rested_seconds")
        else ""
    )
    stdout.print(f"  took {doc.get('seconds', 0):.1f}s{rested}")
    phase = doc.get("phase")
    if phase == Phase.CUT_OVER:
        stdout.print(
            f"  The source keeps the old schemas (renamed, no writes) until: "
            f"shardctl move-shard --cleanup --move {doc.get('move_id')}"
        )
    elif phase in (Phase.PREPARED, Phase.SYNCING, Phase.SYNCED):
        stdout.print(
            f"  Next: shardctl move-shard {doc.get('shards')} --to {doc.get('target')}"
            f"{' sync' if phase == Phase.PREPARED else ' cutover'}"
        )


def _human_status(doc: dict) -> None:
    rows = []
    for m in doc["moves"]:
        progress = ""
        if "tables" in m and "tables_ready" in m:
            progress = f"{m['tables_ready']}/{m['tables']} tables"
        lag = m.get("lag_bytes")
        rows.append(
            [
                m["move_id"],
                m["shards"],
                m["shard_count"],
                f"{m['source']} → {m['target']}",
                m["phase"],
                progress or "-",
                "-" if lag is None else f"{lag} B",
                "-" if m.get("freeze_seconds") is None else f"{m['freeze_seconds']:.3f}s",
                str(m.get("updated_at") or "")[:19],
            ]
        )
    stdout.print(
        table(
            "moves",
            ["move", "shards", "count", "hosts", "phase", "sync", "lag", "freeze", "updated"],
            rows,
        )
    )
    for host, error in doc.get("unreachable", {}).items():
        flagged(host, error)
    stdout.print(f"{doc['in_flight']} move(s) in flight.")
    for line in doc.get("needs_finishing") or []:
        stdout.print(f"  needs finishing: {line}", markup=False, highlight=False)


@cli.command("move-shard")
@click.argument("shard_range", metavar="[RANGE]", required=False)
@click.argument(
    "phase", metavar="[PHASE]", required=False, type=click.Choice(list(PHASE_NAMES) + ["all"])
)
@click.option("--to", "target", metavar="HOST", help="Host that receives the shards.")
@flag_option("--abort", "do_abort", help="Roll the move back: the source is authoritative again.")
@flag_option("--cleanup", "do_cleanup", help="After the cutover: drop the source's old schemas.")
@flag_option(
    "--status", "show_status", help="Show every recorded move, with sync progress and lag."
)
@click.option(
    "--move",
    "move_id",
    metavar="ID",
    help="The move to abort or clean up (default: the one in flight).",
)
@move_options
def move_shard_cmd(
    shard_range: str | None,
    phase: str | None,
    target: str | None,
    do_abort: bool,
    do_cleanup: bool,
    show_status: bool,
    move_id: str | None,
    as_json: bool,
    **kw,
) -> None:
    """Move logical shards to another host online (PHASE: prepare, sync, cutover; default: all three).

    \b
    shardctl move-shard 256-511 --to pg9            prepare, sync and cut over
    shardctl move-shard 256-511 --to pg9 sync       one phase (each is resumable)
    shardctl move-shard --status
    shardctl move-shard 256-511 --abort             roll back (any time before cleanup)
    shardctl move-shard 256-511 --cleanup           drop the source's old schemas
    """
    modes = [
        m
        for m, on in (("--abort", do_abort), ("--cleanup", do_cleanup), ("--status", show_status))
        if on
    ]
    if len(modes) > 1:
        raise BadInput(f"{' and '.join(modes)} are different actions; give one")
    topo = settings().topology()
    # the operations once the topology has loaded: a file that does not load never imports psycopg
    from ..ops.move import abort_move, cleanup_move, move_shards, move_status, parse_range

    options = _options(kw)
    if show_status:
        if shard_range or phase or target:
            raise BadInput("--status takes no shard range, phase or --to")
        doc = move_status(topo, connect_timeout=options.connect_timeout).to_dict()
        finish(as_json, doc, lambda: _human_status(doc), None)
        return
    shards = parse_range(shard_range, topo) if shard_range else None
    if modes:
        if phase:
            raise BadInput(f"{modes[0]} takes no phase")
        action = abort_move if do_abort else cleanup_move
        with move_progress(not as_json) as progress:
            doc = action(
                topo, shards=shards, move_id=move_id, options=options, progress=progress
            ).to_dict()
        finish(as_json, doc, lambda: _human_move(doc), None)
        return
    if shards is None or not target:
        raise BadInput(
            "give the shards and the host to move them to: move-shard RANGE --to HOST [PHASE]"
        )
    if move_id:
        raise BadInput(
            "--move names a move to abort or clean up; a move is named by its shards and --to"
        )
    phases = list(PHASE_NAMES) if phase in (None, "all") else [phase]
    try:
        with move_progress(not as_json) as progress:
            doc = move_shards(
                topo, shards, target, phases=phases, options=options, progress=progress
            ).to_dict()
    except KeyboardInterrupt:
        raise _interrupted(topo, shards, options.connect_timeout) from None
    finish(as_json, doc, lambda: _human_move(doc), None)


def _interrupted(topo: Topology, shards: list[int], connect_timeout: int) -> ShardctlError:
    """Ctrl-C during a move: the move stops where it was (every phase is recorded and resumable, as
    after a crash); the error (exit 130) says which move is left in flight and the command that
    finishes it or rolls it back, read back from the hosts."""
    import psycopg

    from ..errors import Interrupted
    from ..model.ranges import format_shards
    from ..model.topology import Topology
    from ..ops.move import pending_moves

    where = "run shardctl move-shard --status to see what is left"
    try:
        current = Topology.load(topo.path) if topo.path else topo  # a cutover may have flipped it
        lines = pending_moves(current, connect_timeout=connect_timeout)
        mine = [line for line in lines if f"(shards {format_shards(shards)} " in line]
        where = "; ".join(mine or lines) or "no move is left in flight"
    except (ShardctlError, OSError, psycopg.Error):
        pass
    return Interrupted(f"move-shard: interrupted (Ctrl-C): {where}")


@cli.command("rebalance")
@flag_option("--plan", "show_plan", help="Show the moves that would even out the hosts (default).")
@flag_option("--apply", "do_apply", help="Run the planned moves, one host pair at a time.")
@flag_option("--cleanup", "do_cleanup", help="With --apply: clean up each move after its cutover.")
@choice_option(
    "--by",
    ["count", "size"],
    "Even out shards per host, or bytes per host (pg_total_relation_size; placement.pinned stay).",
)
@shown_option(
    "--min-improvement",
    AsciiFloat(0, 1),
    0.05,
    "With --by size: each move must narrow the host spread by this share of the mean host size.",
)
@move_options
def rebalance_cmd(
    show_plan: bool,
    do_apply: bool,
    do_cleanup: bool,
    by: str,
    min_improvement: float,
    as_json: bool,
    **kw,
) -> None:
    """Even out shards (or bytes) per host, e.g. after add-host, with the fewest moves."""
    if show_plan and do_apply:
        raise BadInput("--plan shows the moves and --apply runs them; give one")
    if do_cleanup and not do_apply:
        raise BadInput("--cleanup goes with --apply")
    topo = settings().topology()
    from ..ops.rebalance import rebalance, rebalance_plan

    goal = {"by": by, "min_improvement": min_improvement}  # what the plan evens out, and how far
    if not do_apply:
        doc = rebalance_plan(topo, **goal).to_dict()
        finish(as_json, doc, lambda: _human_plan(doc), None)
        return
    options = _options(kw)
    error: ShardctlError | None = None
    with move_progress(not as_json) as progress:

        def announce(m) -> None:
            if progress:
                progress(
                    "note",
                    0,
                    0,
                    f"moving shards {m.to_dict()['shards']} from {m.source} to {m.target}",
                )

        try:
            doc = rebalance(
                topo,
                options=options,
                progress=progress,
                cleanup=do_cleanup,
                on_move=announce,
                **goal,
            ).to_dict()
        except ShardctlError as exc:
            report = getattr(exc, "report", None)
            if not isinstance(report, dict):
                raise
            doc, error = report, exc

    def human() -> None:
        _human_plan(doc)
        for r in doc.get("results", []):
            _human_move(r)

    finish(as_json, doc, human, error)


def _human_plan(doc: dict) -> None:
    if doc.get("by") == "size":
        stdout.print(
            table(
                "hosts (bytes)",
                ["host", "shards", "after", "bytes", "bytes after"],
                [
                    [h["name"], h["shards"], h["after"], h["bytes"], h["bytes_after"]]
                    for h in doc["hosts"]
                ],
            )
        )
    else:
        stdout.print(
            table(
                "hosts",
                ["host", "shards", "goal", "after"],
                [[h["name"], h["shards"], h["goal"], h["after"]] for h in doc["hosts"]],
            )
        )
    if not doc["moves"]:
        stdout.print("Balanced: nothing to move.")
        return
    stdout.print(
        table(
            f"{len(doc['moves'])} move(s), {doc['shards_to_move']} shards",
            ["from", "to", "shards", "count"],
            [[m["source"], m["target"], m["shards"], m["count"]] for m in doc["moves"]],
        )
    )
    if not doc.get("applied"):
        stdout.print("Run them with: shardctl rebalance --apply")
