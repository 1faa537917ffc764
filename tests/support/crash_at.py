"""Run the shardctl command line and SIGKILL the process at one move checkpoint (the crash tests'
fault injection; shipped code only offers the hook, ``shardctl.ops.move.run.HOOKS``).

    python -m support.crash_at POINT [shardctl arguments...]   (with tests/ on PYTHONPATH)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def command(point: str, *args: str) -> list[str]:
    """The argv that runs ``shardctl args`` and dies by SIGKILL at ``point``."""
    return [sys.executable, "-m", "support.crash_at", point, *args]


def env() -> dict[str, str]:
    """The environment for :func:`command`: tests/ (for ``support``) and the tree under test."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(TESTS.parent)]))


def run(point: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(point, *args),
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def main() -> None:
    from shardctl.cli import main as shardctl_main
    from shardctl.ops.move.run import HOOKS

    point, args = sys.argv[1], sys.argv[2:]
    HOOKS[point] = lambda: os.kill(os.getpid(), signal.SIGKILL)
    sys.argv = ["shardctl", *args]
    shardctl_main()


if __name__ == "__main__":
    main()
