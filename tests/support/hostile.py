"""Running the real CLI on hostile input, and measuring what it cost (issue 15's acceptance).

``run_measured`` starts ``python -m shardctl`` as a child, feeds it stdin (bytes, or a
generator of byte chunks so 10M lines never sit in the test's memory), and reaps it with
``os.wait4``: that child's own peak RSS and CPU time, not the maximum over every child the
test process ever had (``RUSAGE_CHILDREN`` keeps the largest one seen so far).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MAX_SECONDS = 2.0
MAX_MB = 200
MAX_LINE = 500


@dataclass
class Measured:
    exit_code: int
    stdout: bytes
    stderr: str
    seconds: float  # wall clock
    cpu_seconds: float  # user + system
    peak_mb: float

    def __repr__(self) -> str:
        return (
            f"Measured(exit={self.exit_code}, {self.seconds:.2f}s wall, {self.cpu_seconds:.2f}s cpu, "
            f"{self.peak_mb:.0f} MB, stderr={self.stderr[:1500]!r}, stdout={self.stdout[:300]!r})"
        )

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


# The CLI is started by this small wrapper, never forked straight from the test process: a
# child's peak RSS counts the pages it shared with its parent before exec, and a test that
# just built a 50 MB file would be charged for it.
_WRAPPER = """
import json, os, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"exit_code": os.waitstatus_to_exitcode(status), "seconds": time.perf_counter() - started,
               "cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024}, f)
"""


def run_measured(
    *args: str,
    stdin: bytes | Iterable[bytes] | None = None,
    env: dict | None = None,
    keep_stdout: bool = True,
    cwd: str | None = None,
) -> Measured:
    """Run ``shardctl ARGS`` in a fresh process and measure it."""
    environment = {k: v for k, v in os.environ.items() if k != "SHARDCTL_CONFIG"}
    environment.update(env or {})
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile("r", suffix=".json") as report,
    ):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WRAPPER,
                report.name,
                sys.executable,
                "-m",
                "shardctl",
                *map(str, args),
            ],
            stdin=subprocess.PIPE,
            stdout=out if keep_stdout else subprocess.DEVNULL,
            stderr=err,
            env=environment,
            cwd=cwd,
        )
        feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)
        feeder.start()
        proc.wait()
        feeder.join(timeout=10)
        facts = json.loads(Path(report.name).read_text())
        out.seek(0)
        err.seek(0)
        return Measured(
            facts["exit_code"],
            out.read(2_000_000) if keep_stdout else b"",
            err.read(2_000_000).decode("utf-8", "replace"),
            facts["seconds"],
            facts["cpu_seconds"],
            facts["peak_mb"],
        )


def _feed(pipe, data) -> None:
    try:
        if data is None:
            pass
        elif isinstance(data, (bytes, bytearray)):
            pipe.write(data)
        else:
            for chunk in data:
                pipe.write(chunk)
    except (BrokenPipeError, OSError):
        pass  # the CLI may stop reading early; that is its right
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def load_factor() -> float:
    """How many times over the machine is booked (1.0 when there is a core for every runnable task)."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def assert_refused_cheaply(
    result: Measured, *needles: str, code: int = 2, max_mb: float = MAX_MB
) -> str:
    """Exit ``code``, one short stderr line (no traceback) holding ``needles``, within the time and memory bounds."""
    assert result.exit_code == code, result
    assert "Traceback" not in result.stderr, result
    lines = result.stderr_lines
    assert len(lines) == 1, result
    assert len(lines[0]) <= MAX_LINE, (len(lines[0]), result)
    for needle in needles:
        assert needle in lines[0], (needle, result)
    assert_cheap(result, max_mb=max_mb)
    return lines[0]


def assert_cheap(
    result: Measured, max_mb: float = MAX_MB, max_seconds: float = MAX_SECONDS
) -> None:
    """Peak memory within ``max_mb`` and CPU time within ``max_seconds``. Wall-clock time too, scaled by
    twice :func:`load_factor` (a one-minute average that lags a burst): on a 2-core machine shared with
    other test runs (load 10 is common), wall time measures the queue for a core, not the program."""
    assert result.peak_mb <= max_mb, result
    assert result.cpu_seconds <= max_seconds, result
    allowed = max_seconds if load_factor() == 1.0 else max_seconds * 2 * load_factor()
    assert result.seconds <= allowed, (load_factor(), result)
