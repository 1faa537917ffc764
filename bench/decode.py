#!/usr/bin/env python
"""Decoding 1M IDs: the library and the ``shardctl decode-id --csv`` command.

The IDs are real: minted by the rendered next_id() of 64 shards spread over an 8192-shard sandbox fleet
(dataset ``minted``: all within a second or two, as when decoding a fresh batch). A second dataset
(``spread``: the same layout, times spread over the past year, random shards and sequences) is the worst
case for the decoder's per-second timestamp cache.

Candidates:

* library: ``Decoder(layout, topology).write_csv(lines, io.StringIO())`` (with schema and host columns),
  the same without a topology, ``Layout.decode`` in a loop, and ``Decoder.decode_lines``;
* CLI: ``shardctl decode-id --csv`` in a new process, reading the IDs from stdin, with the topology
  (``SHARDCTL_CONFIG``) and with ``--layout instagram``.

Baseline ("floor"): the least any Python decoder does per ID: int() the line, split the three fields with
shifts and masks, and join them as CSV (no timestamp, schema or host), in-process for the library rows and
as a ``python -c`` process reading stdin for the CLI rows.

Targets: library write_csv >= 1M IDs/s; the CLI <= 3 s for 1M IDs.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

MINTING_SHARDS = 64
EPOCH = "2026-01-01T00:00:00Z"


def floor(lines, write) -> None:
    """The floor: the layout's fields by shifts and masks, as CSV, with nothing else."""
    buf = ["id,time,shard,sequence\n"]
    for raw in lines:
        v = int(raw)
        buf.append(f"{v},{v >> 23},{(v >> 10) & 8191},{v & 1023}\n")
        if len(buf) >= 8192:
            write("".join(buf))
            buf.clear()
    write("".join(buf))


# The CLI baseline runs the same function in a fresh interpreter.
FLOOR_CODE = inspect.getsource(floor)

FLOOR_PROCESS = FLOOR_CODE + "\nimport sys\nfloor(sys.stdin, sys.stdout.write)\n"

# shardctl decode-id --csv with bench/_proposals.py's write_csv in place of Decoder.write_csv
PATCHED_CLI = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
    "sys.argv = ['shardctl', 'decode-id', '--csv']; import _proposals; _proposals.patched_cli()"
)


def mint_ids(box, topo, count: int) -> list[int]:
    """``count`` IDs from the rendered next_id() of MINTING_SHARDS shards spread over the fleet."""
    from shardctl.sql.render import render_shard

    step = max(1, topo.shard_count // MINTING_SHARDS)
    chosen = list(range(0, topo.shard_count, step))[:MINTING_SHARDS]
    per = -(-count // len(chosen))
    ids: list[int] = []
    for n in chosen:
        host = topo.host_of(n)
        port = next(h.port for h in box.state.hosts if h.name == host.name)
        with c.connect(port, "app") as conn:
            conn.execute(render_shard(topo, n))
            rows = conn.execute(
                f"SELECT {topo.schema_name(n)}.next_id() FROM generate_series(1, %s)", (per,)
            ).fetchall()
        ids += [r[0] for r in rows]
    return ids[:count]


def spread_ids(layout, count: int, shard_count: int, seed: int = 7) -> list[int]:
    """IDs of ``layout`` with times spread over the past year, random shards and sequences."""
    rng = random.Random(seed)
    now_ms = int(time.time() * 1000) - layout.epoch_ms
    year_ms = 365 * 86_400_000
    lo = max(0, now_ms - year_ms)
    t_shift, s_shift = layout.shift("time"), layout.shift("shard")
    seq_mask = (1 << layout.bits("sequence")) - 1
    ids = [
        (rng.randrange(lo, max(lo + 1, now_ms)) << t_shift)
        | (rng.randrange(shard_count) << s_shift)
        | rng.randrange(seq_mask + 1)
        for _ in range(count)
    ]
    ids.sort()  # a table dump ordered by id
    return ids


def main() -> int:
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--ids",
        type=int,
        default=1_000_000,
        help="IDs to decode (the CLI target, 3 s for 1M, scales linearly with it).",
    )
    p.add_argument(
        "--datasets",
        default=None,
        help="comma-separated: minted, spread (default both; --quick minted)",
    )
    p.add_argument("--skip", default="", help="Comma-separated parts to leave out: cli, library.")
    p.add_argument(
        "--proposals",
        action="store_true",
        help="Also measure the proposed write_csv of bench/_proposals.py (info rows, '(proposal)').",
    )
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or (3 if args.quick else 5))
    count = args.ids
    datasets = [
        d.strip()
        for d in (args.datasets or ("minted" if args.quick else "minted,spread")).split(",")
        if d.strip()
    ]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}

    from shardctl.ids.decode import Decoder
    from shardctl.model.layouts import by_name, parse_epoch

    cli_limit = 3.0 * count / 1_000_000  # the target, 3 s for 1M IDs, scaled to --ids
    tables: list[list[c.Row]] = []
    notes: list[str] = []
    doc: dict = {"ids": count, "rounds": rounds, "results": {}}
    with (
        c.sandbox(
            hosts=2,
            shards=8192,
            keep=args.keep,
            prefix="shardctl-bench-decode-",
            base=c.sandbox_base(args.tmp, need_gb=1),
        ) as box,
        tempfile.TemporaryDirectory(prefix="shardctl-bench-decode-io-") as tmp,
    ):
        topo = c.load_topology(box.topology_path)
        layout = topo.layout
        foreign = by_name("instagram", parse_epoch(EPOCH))
        if foreign != layout:
            raise SystemExit(
                "the sandbox topology's layout is not instagram with the expected epoch"
            )
        data: dict[str, list[int]] = {}
        if "minted" in datasets:
            started = time.perf_counter()
            data["minted"] = mint_ids(box, topo, count)
            notes.append(
                f"minted: {count} IDs from next_id() of {MINTING_SHARDS} shards on {len(topo.hosts)} "
                f"hosts ({time.perf_counter() - started:.1f}s, not timed)"
            )
        if "spread" in datasets:
            data["spread"] = spread_ids(layout, count, topo.shard_count)
            notes.append(
                "spread: times uniform over the past year (one distinct second per ID, nearly)"
            )

        for dataset, ids in data.items():
            lines = [f"{v}\n" for v in ids]
            input_path = Path(tmp) / f"{dataset}.txt"
            input_path.write_text("".join(lines))
            with_topo, bare = Decoder(layout, topo), Decoder(layout)

            def lib_floor() -> str:
                out = io.StringIO()
                floor(lines, out.write)
                return out.getvalue()

            def lib_topo() -> str:
                out = io.StringIO()
                bad = with_topo.write_csv(lines, out)
                if bad:
                    raise SystemExit(f"write_csv rejected {len(bad)} IDs, e.g. {bad[:3]}")
                return out.getvalue()

            def lib_bare() -> str:
                out = io.StringIO()
                bare.write_csv(lines, out)
                return out.getvalue()

            def lib_proposal() -> str:
                import _proposals

                out = io.StringIO()
                bad = _proposals.write_csv(with_topo, lines, out)
                if bad:
                    raise SystemExit(f"proposal rejected {len(bad)} IDs, e.g. {bad[:3]}")
                return out.getvalue()

            def lib_layout() -> int:
                dec = layout.decode
                return len([dec(v) for v in ids])

            def lib_lines() -> int:
                results, _bad = with_topo.decode_lines(lines)
                return len(results)

            def cli(extra: list[str], code: str | None = None) -> tuple[float, str]:
                out_path = Path(tmp) / "out.csv"
                if code is not None:
                    cmd = [sys.executable, "-c", code]
                else:
                    exe = Path(sys.executable).with_name("shardctl")
                    cmd = (
                        ([str(exe)] if exe.exists() else [sys.executable, "-m", "shardctl.cli"])
                        + ["decode-id", "--csv"]
                        + extra
                    )
                env = dict(os.environ, SHARDCTL_CONFIG=str(box.topology_path))
                with open(input_path, "rb") as stdin, open(out_path, "wb") as stdout:
                    started = time.perf_counter()
                    proc = subprocess.run(
                        cmd,
                        stdin=stdin,
                        stdout=stdout,
                        stderr=subprocess.PIPE,
                        env=env,
                        timeout=600,
                        check=False,
                    )
                    elapsed = time.perf_counter() - started
                if proc.returncode != 0:
                    raise SystemExit(
                        f"{' '.join(cmd[-4:])} exited {proc.returncode}: {proc.stderr[-1500:]!r}"
                    )
                return elapsed, hashlib.sha256(out_path.read_bytes()).hexdigest()

            lib: dict[str, tuple[str, object]] = {}
            if "library" not in skip:
                lib = {
                    "floor": ("floor: int() + 3 fields, join", lib_floor),
                    "topo": ("Decoder(layout, topology).write_csv", lib_topo),
                    "bare": ("Decoder(layout).write_csv", lib_bare),
                    "layout": ("Layout.decode loop", lib_layout),
                    "lines": ("Decoder.decode_lines", lib_lines),
                }
                if args.proposals:
                    lib["ptopo"] = ("(proposal) write_csv, chunked fast path", lib_proposal)
            clis: dict[str, tuple[str, list[str], str | None]] = {}
            if "cli" not in skip:
                clis = {
                    "cfloor": ("floor process: python -c, same loop", [], FLOOR_PROCESS),
                    "ctopo": ("shardctl decode-id --csv (topology)", [], None),
                    "clayout": (
                        "shardctl decode-id --csv --layout instagram",
                        ["--layout", "instagram", "--epoch", EPOCH],
                        None,
                    ),
                }
                if args.proposals:
                    clis["pctopo"] = ("(proposal) decode-id --csv, patched", [], PATCHED_CLI)
            series = {k: c.Series(v[0], work=count) for k, v in {**lib, **clis}.items()}
            digests: dict[str, str] = {}
            keys = list(series)
            for r in range(rounds):
                for key in c.rotated(keys, r):
                    if key in lib:
                        seconds, result = c.timed(lib[key][1])
                        if isinstance(result, str):
                            digests[key] = hashlib.sha256(result.encode()).hexdigest()
                    else:
                        _, extra, code = clis[key]
                        seconds, digests[key] = cli(extra, code)
                    series[key].add(seconds)
                c.log(
                    f"{dataset} round {r + 1}/{rounds}: "
                    + ", ".join(f"{k} {series[k].seconds[-1]:.2f}s" for k in keys)
                )
            # The command must print exactly what the library writes.
            if "topo" in digests and "ctopo" in digests and digests["topo"] != digests["ctopo"]:
                raise SystemExit("shardctl decode-id --csv output differs from Decoder.write_csv's")
            if "bare" in digests and "clayout" in digests and digests["bare"] != digests["clayout"]:
                raise SystemExit(
                    "shardctl decode-id --csv --layout output differs from Decoder(layout).write_csv's"
                )
            for key in ("ptopo", "pctopo"):
                if key in digests and "topo" in digests and digests[key] != digests["topo"]:
                    raise SystemExit(
                        f"{key}: the proposal's output differs from Decoder.write_csv's"
                    )
            _spot_check(lib_topo() if "topo" in lib else None, ids, layout)

            rows = []
            for key in keys:
                s = series[key]
                base = series["floor" if key in lib else "cfloor"]
                ratio = s.ratio_to(base)
                rng = c.ratio_range(s.ratios_to(base))
                note = ""
                if key in ("floor", "cfloor"):
                    target, ok = "baseline", None
                elif key in ("topo", "bare"):
                    target, ok = ">= 1M IDs/s", s.median_rate >= 1_000_000
                elif key in ("layout", "lines"):
                    target, ok = "(info)", None
                    note = "dict per ID"
                elif key in ("ptopo", "pctopo"):
                    target, ok = "(info) not shardctl today", None
                else:
                    target, ok = f"<= {cli_limit:g} s", s.median_s <= cli_limit
                value = c.fmt_rate(s.median_rate, "IDs/s")
                if key in clis:
                    note = f"{c.fmt_s(s.median_s)} for {count:,} IDs"
                rows.append(
                    c.Row(s.name, value, c.spread_rate(s, "IDs/s"), ratio, target, ok, note, rng)
                )
                doc["results"].setdefault(dataset, {})[key] = {
                    "seconds": s.seconds,
                    "median_ids_per_s": s.median_rate,
                }
            c.print_table(
                f"decode {count:,} IDs, dataset {dataset}, median of {rounds} rounds",
                rows,
                "floor",
                [
                    (
                        "ratios: rate / the floor's rate in the same round (library rows vs the in-process "
                        "floor, CLI rows vs the floor process); higher is better"
                    )
                ],
            )
            tables.append(rows)
    for n in notes + [c.machine_note()]:
        print(f"  {n}")
    c.save_run(args, doc)
    return c.verdict_exit(tables)


def _spot_check(csv_text: str | None, ids: list[int], layout) -> None:
    """A few rows of write_csv's output against Layout.decode (a fast wrong answer is no answer)."""
    if csv_text is None:
        return
    rows = csv_text.splitlines()
    if len(rows) != len(ids) + 1:
        raise SystemExit(f"write_csv wrote {len(rows) - 1} rows for {len(ids)} IDs")
    for i in (0, len(ids) // 2, len(ids) - 1):
        got = rows[i + 1].split(",")
        want = layout.decode(ids[i])
        if (
            int(got[0]) != want["id"]
            or got[1] != want["time"]
            or int(got[2]) != want["shard"]
            or int(got[3]) != want["sequence"]
        ):
            raise SystemExit(
                f"write_csv row {i + 1} {rows[i + 1]!r} disagrees with Layout.decode: {want}"
            )


if __name__ == "__main__":
    sys.exit(main())
