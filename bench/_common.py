"""Shared plumbing for the benchmark scripts in bench/.

Every benchmark follows the same rules:

* it starts its own sandbox (``shardctl.dev.sandbox.Sandbox``) in a temp dir and destroys it at the end;
* every candidate is measured in the same run, on the same servers, against a baseline;
* candidates are interleaved over several rounds (the order rotates each round, so no
  candidate always runs first or last) and the figure reported is the median;
* the result is a table (candidate, median, spread, ratio vs baseline, target, PASS/FAIL)
  and the exit code is 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import results

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent

warnings.filterwarnings("ignore", message=".*instagram layout uses all 64 bits.*")


def _quiet_layout_warnings() -> None:
    try:
        from shardctl.model.topology import LayoutWarning
    except ImportError:  # pragma: no cover - shardctl not importable: the script fails later anyway
        return
    warnings.filterwarnings("ignore", category=LayoutWarning)


_quiet_layout_warnings()


# ---- statistics -----------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def rotated(items: list, round_no: int) -> list:
    """``items`` rotated by ``round_no``: each candidate takes every position in turn."""
    if not items:
        return []
    k = round_no % len(items)
    return items[k:] + items[:k]


@dataclass
class Series:
    """All the measurements of one candidate: seconds per round, and the work done per round."""

    name: str
    seconds: list[float] = field(default_factory=list)
    work: float = 1.0  # items per round (rows, IDs, shards) for a rate
    unit: str = "s"

    def add(self, seconds: float) -> None:
        self.seconds.append(seconds)

    @property
    def median_s(self) -> float:
        return median(self.seconds)

    @property
    def rates(self) -> list[float]:
        return [self.work / s for s in self.seconds if s > 0]

    @property
    def median_rate(self) -> float:
        return median(self.rates)

    def ratios_to(self, base: Series, *, faster_is_higher: bool = True) -> list[float]:
        """Per round: this candidate's rate over the baseline's (or its time over the baseline's)."""
        pairs = list(zip(self.seconds, base.seconds))
        if faster_is_higher:
            return [(self.work / s) / (base.work / b) for s, b in pairs if s > 0 and b > 0]
        return [s / b for s, b in pairs if b > 0]

    def ratio_to(self, base: Series, *, faster_is_higher: bool = True) -> float:
        """Median over rounds of the ratio to the baseline measured in the same round.

        Pairing by round cancels most of the load other programs put on the machine.
        """
        return median(self.ratios_to(base, faster_is_higher=faster_is_higher))


# ---- results table ------------------------------------------------------------------------


VERDICTS = {True: "PASS", False: "FAIL", None: "info"}


@dataclass
class Row:
    candidate: str
    value: str  # the median, formatted with its unit
    spread: str  # min–max over the rounds
    ratio: float | None  # vs the baseline (None: not applicable)
    target: str = ""  # human text, e.g. ">= 0.90x bigserial"
    ok: bool | None = None  # None: informational
    note: str = ""
    ratio_range: tuple[float, float] | None = None  # min and max of the per-round ratios

    @property
    def verdict(self) -> str:
        return VERDICTS[self.ok]

    def figures(self, series: Series | None = None) -> dict:
        """The row as a run file keeps it: what the table prints, with the series' seconds as numbers."""
        doc: dict = {
            "candidate": self.candidate,
            "median": self.value,
            "spread": self.spread,
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "ratio_range": [round(v, 3) for v in self.ratio_range] if self.ratio_range else None,
            "target": self.target,
            "verdict": self.verdict,
            "note": self.note,
        }
        if series is not None and series.seconds:
            doc["median_s"] = round(series.median_s, 4)
            doc["min_s"] = round(min(series.seconds), 4)
            doc["max_s"] = round(max(series.seconds), 4)
        return doc

    @property
    def ratio_text(self) -> str:
        if self.ratio is None:
            return ""
        if self.ratio_range and self.ratio_range[0] != self.ratio_range[1]:
            return f"{self.ratio:.2f}x ({self.ratio_range[0]:.2f}–{self.ratio_range[1]:.2f})"
        return f"{self.ratio:.2f}x"


def ratio_range(values: list[float]) -> tuple[float, float] | None:
    return (min(values), max(values)) if values else None


def fmt_rate(v: float, unit: str) -> str:
    if math.isnan(v):
        return "n/a"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M {unit}"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k {unit}"
    return f"{v:.1f} {unit}"


def fmt_s(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    if v < 1:
        return f"{v * 1000:.0f} ms"
    return f"{v:.2f} s"


def spread_rate(series: Series, unit: str) -> str:
    rates = series.rates
    if not rates:
        return ""
    return f"{fmt_rate(min(rates), '').strip()} – {fmt_rate(max(rates), '').strip()}"


def spread_s(series: Series) -> str:
    if not series.seconds:
        return ""
    return f"{fmt_s(min(series.seconds))} – {fmt_s(max(series.seconds))}"


def print_table(
    title: str, rows: list[Row], baseline_label: str, footnotes: list[str] | None = None
) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        Console = None
    verdicts = VERDICTS
    if Console is not None:
        table = Table(title=title, title_justify="left")
        for col, kw in (
            ("candidate", {}),
            ("median", {"justify": "right"}),
            ("min – max", {"justify": "right"}),
            (f"vs {baseline_label} (min–max)", {"justify": "right"}),
            ("target", {}),
            ("result", {}),
            ("note", {}),
        ):
            table.add_column(col, **kw)
        for r in rows:
            verdict = verdicts[r.ok]
            style = {"PASS": "green", "FAIL": "bold red", "info": "dim"}[verdict]
            table.add_row(
                r.candidate,
                r.value,
                r.spread,
                r.ratio_text,
                r.target,
                f"[{style}]{verdict}[/{style}]",
                r.note,
            )
        console = Console(width=max(180, shutil.get_terminal_size((150, 40)).columns))
        console.print(table)
        for note in footnotes or []:
            console.print(f"  {note}", highlight=False)
        return
    print(title)
    for r in rows:
        print(
            f"  {r.candidate:<40} {r.value:>14} {r.spread:>24} {r.ratio_text:>20} {r.target:<28} {verdicts[r.ok]}"
            f" {r.note}"
        )
    for note in footnotes or []:
        print(f"  {note}")


def verdict_exit(rows_by_table: list[list[Row]]) -> int:
    missed = [r for rows in rows_by_table for r in rows if r.ok is False]
    if missed:
        print(
            f"\n{len(missed)} target(s) missed: "
            + "; ".join(f"{r.candidate} ({r.target})" for r in missed)
        )
        return 1
    print("\nall targets met")
    return 0


def write_json(path: str | None, doc: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(doc, indent=2, default=str) + "\n")


def save_run(args: argparse.Namespace, doc: dict) -> None:
    """The run's figures: to ``--json FILE`` when asked, and to bench/results/ (``results.record``)."""
    write_json(args.json_path, doc)
    if not args.no_record:
        results.record(Path(sys.argv[0]).stem, doc)


# ---- command line ------------------------------------------------------------------------------


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=None, help="Rounds (>= 3; medians are reported).")
    p.add_argument(
        "--quick", action="store_true", help="Smaller sizes and 3 rounds: a couple of minutes."
    )
    p.add_argument(
        "--keep", action="store_true", help="Keep the sandbox directory (servers are stopped)."
    )
    p.add_argument(
        "--json", dest="json_path", metavar="FILE", help="Also write the results as JSON."
    )
    p.add_argument(
        "--tmp",
        metavar="DIR",
        default=None,
        help="Where the sandbox's temp dir goes (default: /dev/shm when it is a tmpfs with room, "
        "else the system temp dir).",
    )
    results.add_option(p)
    return p


def sandbox_base(choice: str | None, need_gb: float = 4.0) -> str | None:
    """The parent directory of the sandbox: ``choice``, else /dev/shm (tmpfs) when it has room.

    Why tmpfs: the sandbox's servers run with fsync off anyway, and on a shared VM's ext4 the kernel's
    inode allocator (ext4_create -> recently_deleted) makes creating thousands of relation files cost
    5-50x more, varying with what other users' tests just deleted. That drowns the difference between
    the candidates, which all create the same files.
    """
    if choice:
        return choice
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize >= need_gb * 1024**3 and os.access(shm, os.W_OK):
        return str(shm)
    return None


def check_rounds(rounds: int) -> int:
    if rounds < 3:
        raise SystemExit(
            "--rounds must be at least 3 (medians of fewer rounds are not worth reporting)"
        )
    return rounds


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- sandbox and servers -----------------------------------------------------------------------


@contextlib.contextmanager
def sandbox(
    hosts: int,
    shards: int,
    *,
    function: str = "plpgsql",
    keep: bool = False,
    prefix: str = "shardctl-bench-",
    base: str | None = None,
    pg: str | None = None,
) -> Iterator[object]:
    """A fresh sandbox in a temp dir (under ``base``), PostgreSQL ``pg`` (a major version; default the
    newest); stopped and deleted afterwards (kept stopped with ``keep``)."""
    from shardctl.dev.sandbox import Sandbox

    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    box = Sandbox(directory)
    started = time.perf_counter()
    try:
        box.up(hosts=hosts, shards=shards, function=function, pg=pg)
        log(
            f"sandbox: {hosts} PostgreSQL server(s) in {directory} ({time.perf_counter() - started:.1f}s)"
        )
        yield box
    finally:
        if keep:
            with contextlib.suppress(Exception):
                box.down()
            log(f"sandbox kept (stopped) in {directory}")
        else:
            box.destroy()
            log("sandbox destroyed")


def admin_dsn(port: int, db: str = "postgres") -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/{db}"


def connect(port: int, db: str = "postgres", autocommit: bool = True):
    import psycopg

    return psycopg.connect(admin_dsn(port, db), autocommit=autocommit)


def server_version(port: int) -> int:
    with connect(port) as conn:
        return int(conn.execute("SHOW server_version_num").fetchone()[0])


def create_databases(ports: list[int], tag: str, template: str | None = None) -> list[str]:
    """One fresh database per server; returns their names (same index as ``ports``)."""
    names = []
    for port in ports:
        name = f"b_{tag}_{uuid.uuid4().hex[:8]}"
        with connect(port) as conn:
            tpl = f" TEMPLATE {template}" if template else ""
            conn.execute(f"CREATE DATABASE {name}{tpl}")
        names.append(name)
    return names


def drop_databases(ports: list[int], names: list[str]) -> None:
    for port, name in zip(ports, names):
        with contextlib.suppress(Exception), connect(port) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def checkpoint(ports: list[int]) -> None:
    """Flush dirty buffers before a timed run, so no candidate pays for the previous one's writes."""
    for port in ports:
        with connect(port) as conn:
            conn.execute("CHECKPOINT")


def topology_for(
    box,
    databases: list[str],
    shards: int,
    *,
    function: str = "plpgsql",
    name: str = "topo",
    migrations: str = "migrations/",
    schema: str = "insta{n}",
    hosts: list[int] | None = None,
    extra: str = "",
) -> Path:
    """A topology file over ``databases`` (one per sandbox server, or per server of ``hosts``, their
    indexes), written in the sandbox dir; ``extra``: more top-level sections, as YAML text."""
    state = box.state
    servers = [state.hosts[i] for i in hosts] if hosts is not None else state.hosts
    n = len(servers)
    lines = [
        "version: 1",
        "id:",
        "  layout: instagram",
        '  epoch: "2026-01-01T00:00:00Z"',
        f"  function: {function}",
        "shards:",
        f"  count: {shards}",
        f'  schema: "{schema}"',
        f"migrations: {migrations}",
        *extra.splitlines(),
        "hosts:",
    ]
    for i, (host, db) in enumerate(zip(servers, databases)):
        lo, hi = i * shards // n, (i + 1) * shards // n - 1
        lines += [
            f"  - name: {host.name}",
            f'    dsn: "postgresql://postgres@127.0.0.1:{host.port}/{db}"',
            f'    shards: "{lo}-{hi}"',
        ]
    path = box.dir / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def load_topology(path: Path):
    from shardctl.model.topology import LayoutWarning, Topology

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LayoutWarning)
        return Topology.load(path)


def psql_files_parallel(bin_dir: str, jobs: list[tuple[int, str, Path]]) -> float:
    """Run ``psql -f file`` for every (port, database, file) at once; seconds until the last one ends."""
    psql = str(Path(bin_dir) / "psql")
    env = dict(os.environ, PGCONNECT_TIMEOUT="10")
    env.pop("PGOPTIONS", None)
    started = time.perf_counter()
    procs = []
    for port, db, path in jobs:
        args = [
            psql,
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "postgres",
            "-d",
            db,
            "-f",
            str(path),
        ]
        procs.append(
            (
                subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env),
                path,
            )
        )
    errors = []
    for proc, path in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            errors.append(
                f"{path.name}: exit {proc.returncode}: {err.decode(errors='replace')[-800:]}"
            )
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError("psql failed:\n" + "\n".join(errors))
    return elapsed


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def machine_note() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0, 0, 0)
    return f"{os.cpu_count()} CPU(s), load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"


# ---- the code of another checkout ----------------------------------------


def commit_of(directory: Path | str = REPO) -> str:
    """The checkout's commit (short), with ``+dirty`` when it has uncommitted changes."""

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(directory), *args], capture_output=True, text=True, check=False
        )
        return out.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def against_env(directory: str | None) -> dict[str, str]:
    """The environment that runs shardctl from the checkout in ``directory`` (first on PYTHONPATH)."""
    env = dict(os.environ)
    if directory:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [directory, env.get("PYTHONPATH")]))
    return env


def compile_package(env: dict) -> Path:
    """Compile (to ``__pycache__``) the ``shardctl`` package that ``python -m shardctl`` imports with
    ``env``; returns its directory. ``py_compile`` writes even under PYTHONDONTWRITEBYTECODE.

    The installed state (pip compiles a package when it installs it): without it, a checkout under
    PYTHONDONTWRITEBYTECODE=1 compiles every module it imports from source on every run (~80 ms of a
    ``migrate --check`` process), which no user pays."""
    proc = subprocess.run(
        [sys.executable, "-c", "import shardctl, os; print(os.path.dirname(shardctl.__file__))"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tempfile.gettempdir(),
        check=True,
    )
    package = Path(proc.stdout.strip())
    if not compileall.compile_dir(str(package), quiet=2):
        raise SystemExit(f"compileall failed for {package}")
    return package
