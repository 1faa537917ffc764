"""Where a benchmark run is kept: one JSON file per run under bench/results/.

The docs hold one current table; the runs behind it, and every run before it, are files here, so a
figure can be traced to the commit, the date and the machine that produced it. Every script in
bench/ calls ``record`` once at the end of a run (``--no-record`` skips it):

    bench/results/<bench>-<YYYY-MM-DD>-<commit>.json       (-2, -3, ... for further runs that day)

A file holds ``bench``, ``date`` (UTC), ``commit`` (``git rev-parse --short HEAD``, with ``dirty``
when the tree had changes), ``command``, ``machine`` (``nproc``, CPU model, memory, load average at
the end) and ``figures`` (what the script measured, as it prints them).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO = RESULTS_DIR.parents[1]


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    return out.stdout.strip()


def _proc_field(path: str, key: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key:
                return value.strip()
    except OSError:
        pass
    return ""


def machine() -> dict:
    """The machine a run measured: cores, CPU model, memory, and the load it shared them with."""
    mem_kb = _proc_field("/proc/meminfo", "MemTotal").split()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "nproc": os.cpu_count(),
        "model": _proc_field("/proc/cpuinfo", "model name") or None,
        "memory_gb": round(int(mem_kb[0]) / 1024**2, 1) if mem_kb else None,
        "load_average": [round(v, 2) for v in load],
    }


def add_option(parser) -> None:
    """The ``--no-record`` option every script takes (a run for trying things out leaves no file)."""
    parser.add_argument(
        "--no-record",
        action="store_true",
        help="Do not write this run to bench/results/.",
    )


def record(bench: str, figures: dict, *, directory: Path | None = None) -> Path:
    """Write one run of ``bench`` to bench/results/ and return the file's path."""
    directory = directory or RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.timezone.utc)
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    doc = {
        "bench": bench,
        "date": now.isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "figures": figures,
    }
    stem = f"{bench}-{now:%Y-%m-%d}-{commit}"
    path = directory / f"{stem}.json"
    n = 1
    while path.exists():
        n += 1
        path = directory / f"{stem}-{n}.json"
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"run recorded in {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return path
