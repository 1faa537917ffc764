#!/usr/bin/env python
"""Process start-up: how long a short shardctl command takes, from exec to exit.

Candidates, each a new process per round:

* ``shardctl decode-id --layout instagram 1``: offline, no topology file;
* ``shardctl info``: offline, reads and validates the sandbox's topology file;
* ``shardctl migrate --check``: connects to every host of a small initialised sandbox fleet
  (2 hosts, 64 shards) and reads the migration ledger.

Baseline: ``python -c pass`` (the interpreter's own start-up), measured in the same rounds.
Candidates are interleaved and the order rotates each round; the figure is the median.

For each offline command the script also checks, once, with ``python -X importtime``, that psycopg
is not imported: the offline commands must not pay for the database driver. That check is the only
target; the times are reported for comparison between versions.

``--against DIR`` also runs every shardctl candidate with the checkout in DIR first on PYTHONPATH, in
the same rounds (a before/after figure on the same machine load); for example, the previous commit:
``git worktree add /tmp/before HEAD~1 && python bench/startup.py --against /tmp/before``.

Bytecode: before the rounds, the ``shardctl`` package each candidate imports (this checkout's and, with
``--against``, the other one's) is compiled to ``__pycache__`` (``compileall``, quietly). That is the
state of an installed shardctl (pip compiles a package when it installs it); without it, an editable
checkout under ``PYTHONDONTWRITEBYTECODE=1`` would compile every module it imports from source on
every run, and a checkout with stale or missing ``.pyc`` files would pay more than one with fresh ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

SHARDCTL = [sys.executable, "-m", "shardctl"]
OFFLINE = ("decode-id", "info")
# Not the repository: ``python -m`` puts the working directory first on sys.path, ahead of PYTHONPATH.
CWD = tempfile.gettempdir()


def candidates(topology: Path, env: dict, against: str | None) -> list[tuple[str, list[str], dict]]:
    """(label, argv, environment) of the baseline and every command (twice with ``against``)."""
    commands = [
        ("decode-id --layout instagram 1", [*SHARDCTL, "decode-id", "--layout", "instagram", "1"]),
        ("info", [*SHARDCTL, "--config", str(topology), "info"]),
        ("migrate --check", [*SHARDCTL, "--config", str(topology), "migrate", "--check"]),
    ]
    out = [("python -c pass", [sys.executable, "-c", "pass"], env)]
    for label, argv in commands:
        out.append((label, argv, env))
        if against:
            other = {
                **env,
                "PYTHONPATH": os.pathsep.join(filter(None, [against, env.get("PYTHONPATH")])),
            }
            out.append((f"{label} @ {Path(against).name}", argv, other))
    return out


def run_once(argv: list[str], env: dict) -> float:
    started = time.perf_counter()
    proc = subprocess.run(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        timeout=120,
        cwd=CWD,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv[2:])}: exit {proc.returncode}: {proc.stderr.decode()[-600:]}"
        )
    return elapsed


def imports_psycopg(argv: list[str], env: dict) -> bool:
    """Whether the command imports psycopg (``-X importtime`` lists every module imported)."""
    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=120,
        cwd=CWD,
        check=False,
    )
    return any(
        line.rsplit("|", 1)[-1].strip().split(".")[0] == "psycopg"
        for line in proc.stderr.splitlines()
    )


def main() -> int:
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--against", metavar="DIR", help="Also run every command from the checkout in DIR."
    )
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or (10 if args.quick else 30))
    env = {k: v for k, v in os.environ.items() if k != "SHARDCTL_CONFIG"}
    against = str(Path(args.against).resolve()) if args.against else None
    with c.sandbox(
        hosts=2,
        shards=64,
        keep=args.keep,
        prefix="shardctl-bench-startup-",
        base=c.sandbox_base(args.tmp, need_gb=0.5),
    ) as box:
        cands = candidates(box.topology_path, env, against)
        envs = {cenv.get("PYTHONPATH"): cenv for _, _, cenv in cands}  # one per checkout
        for cenv in envs.values():  # the installed state: every module has its .pyc
            print(
                f"compiled {c.compile_package(cenv)} (bytecode, as pip installs it)",
                file=sys.stderr,
            )
        run_once([*SHARDCTL, "--config", str(box.topology_path), "init"], env)
        series = {label: c.Series(label) for label, _, _ in cands}
        for label, argv, cenv in cands:  # warm the page cache and the bytecode caches
            run_once(argv, cenv)
        for r in range(rounds):
            for label, argv, cenv in c.rotated(cands, r):
                series[label].add(run_once(argv, cenv))
        psycopg_free = {
            label: not imports_psycopg(argv, cenv)
            for label, argv, cenv in cands
            if label.split()[0] in OFFLINE
        }
    base = series["python -c pass"]
    rows = []
    for label, _, _ in cands:
        s = series[label]
        extra = s.median_s - base.median_s
        ok = psycopg_free.get(label)
        target = "no psycopg import" if label in psycopg_free else ""
        note = "" if s is base else f"+{extra * 1000:.0f} ms over python"
        if label in psycopg_free and not ok:
            note += "; imports psycopg"
        twin = series.get(f"{label} @ {Path(against).name}") if against else None
        if twin is not None:
            note += f"; {s.ratio_to(twin, faster_is_higher=False):.2f}x the time of {Path(against).name}"
        rows.append(
            c.Row(
                label,
                c.fmt_s(s.median_s),
                c.spread_s(s),
                None if s is base else s.ratio_to(base, faster_is_higher=False),
                target,
                ok,
                note,
                None if s is base else c.ratio_range(s.ratios_to(base, faster_is_higher=False)),
            )
        )
    c.print_table(
        f"Start-up, new process per run (median of {rounds})",
        rows,
        "python -c pass",
        [
            c.machine_note(),
            (
                "every checkout's shardctl package compiled to .pyc before the rounds "
                "(as installed; see the docstring)"
            ),
        ],
    )
    c.save_run(
        args,
        {
            "rounds": rounds,
            "series": {k: v.seconds for k, v in series.items()},
            "psycopg_free": psycopg_free,
        },
    )
    return c.verdict_exit([rows])


if __name__ == "__main__":
    sys.exit(main())
