"""The default suite's time and CPU, interleaved with another checkout's, on a machine whose speed drifts.

    python bench/suite.py                                  # this checkout, 2 rounds
    python bench/suite.py --base /path/to/worktree         # base, this, base, this
    python bench/suite.py --rounds 1 -- tests/fleet/test_move.py -n 0

On a shared virtual machine one run of the same suite can take 3:38 or 4:34, so one run against
another says little: the runs alternate, and each line also gives a fixed Python loop's time (the
machine's speed at that moment). Run as root, each run goes into a cgroup (v1 ``cpuacct``) and the
line gives its CPU seconds, PostgreSQL servers included. Make a base worktree with
``git worktree add /tmp/base COMMIT``; it runs with ``PYTHONPATH`` on it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import results

ROOT = Path(__file__).resolve().parents[1]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def calibration() -> float:
    """Seconds of a fixed Python loop, best of three."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        sum(i * i for i in range(3_000_000))
        best = min(best, time.perf_counter() - started)
    return best


def run(tree: Path, pytest_args: list[str]) -> tuple[float, float | None, list[str]]:
    """(wall seconds, CPU seconds or None, pytest's FAILED/ERROR lines and last line) of the suite in
    ``tree``."""
    group = CPUACCT / f"shardctl-suite-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError:
        group = None  # not root, or no cgroup v1 cpuacct: time only
    env = dict(os.environ, CI=os.environ.get("CI", "true"))
    if tree != ROOT:
        env["PYTHONPATH"] = str(tree)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
    if group is not None:  # join the cgroup before exec, so every child is counted
        command = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *command]
    started = time.perf_counter()
    out = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    cpu = None
    if group is not None:
        cpu = int((group / "cpuacct.usage").read_text()) / 1e9
        group.rmdir()
    lines = (out.stdout or out.stderr).strip().splitlines()
    failures = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return wall, cpu, failures + [lines[-1] if lines else f"exit {out.returncode}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--base", type=Path, help="Another checkout, run before this one each round."
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("pytest_args", nargs="*", help="After --: arguments for pytest.")
    results.add_option(parser)
    args = parser.parse_args()
    runs: list[dict] = []
    trees = ([("base", args.base.resolve())] if args.base else []) + [("this", ROOT)]
    for round_ in range(1, args.rounds + 1):
        for name, tree in trees:
            calib = calibration()
            wall, cpu, lines = run(tree, args.pytest_args)
            cpu_text = f"{cpu:7.1f}" if cpu is not None else "      -"
            print(
                f"{name} round {round_}: calibration {calib:.3f}s  wall {wall:7.1f}s  "
                f"cpu {cpu_text}s  {lines[-1]}",
                flush=True,
            )
            for line in lines[:-1]:  # which tests failed, so a flaky one can be found again
                print(f"    {line}", flush=True)
            runs.append(
                {
                    "tree": name,
                    "round": round_,
                    "calibration_seconds": round(calib, 3),
                    "wall_seconds": round(wall, 1),
                    "cpu_seconds": round(cpu, 1) if cpu is not None else None,
                    "result": lines[-1],
                    "failures": lines[:-1],
                }
            )
    if not args.no_record:
        results.record(
            "suite",
            {
                "base": str(args.base) if args.base else None,
                "pytest_args": args.pytest_args,
                "runs": runs,
            },
        )


if __name__ == "__main__":
    main()
