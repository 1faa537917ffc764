"""The 65,536-shard fleet (issue 16), in the slow suite: ``python -m pytest -m slow tests/fleet/test_scale.py -s``.

Custom layout with 16 shard bits over 8 sandbox servers on this machine: init (64,512 shards), add-shard of
1,024 (to the layout's 65,536), ``migrate --check``, verify, status, and one move of 64 shards. Prints the
figures; init's peak RSS must stay within 300 MB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support.fleet import load, run_cli

from shardctl.dev.process import ram_backed_dir
from shardctl.dev.sandbox import Sandbox
from shardctl.ops.status import status
from shardctl.ops.verify import verify

HOSTS = 8
TOTAL = 65_536  # 16 shard bits
ADDED = 1_024
FIRST = TOTAL - ADDED
MOVED = 64
MAX_RSS_MB = 300

# The peak is this process's VmHWM, never getrusage's ru_maxrss: Linux carries the largest RSS of
# the memory image an exec replaced into ru_maxrss, and subprocess forks (vfork) the pytest worker,
# so ru_maxrss reported the worker's own peak (667 MB after other slow tests) as init's.
RSS_WRAPPER = """import sys
from shardctl.cli import main
sys.argv = ["shardctl"] + sys.argv[1:]
try:
    main()
finally:
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    print(f"peak-rss-kb {peak}", file=sys.stderr)
"""


def topology_text(box) -> str:
    lines = [
        "version: 1",
        "id:",
        "  layout: custom",
        '  epoch: "2026-01-01T00:00:00Z"',
        "  function: plpgsql",
        "  bits: {time: 41, shard: 16, sequence: 6}",
        "shards:",
        f"  count: {FIRST}",
        '  schema: "s{n}"',
        "migrations: migrations/",
        "routing:",
        "  key: user_id",
        "hosts:",
    ]
    for i, host in enumerate(box.state.hosts):
        lo, hi = i * FIRST // HOSTS, (i + 1) * FIRST // HOSTS - 1
        lines += [f"  - name: {host.name}", f'    dsn: "{host.dsn}"', f'    shards: "{lo}-{hi}"']
    return "\n".join(lines) + "\n"


def timed_cli(*args: str, config) -> tuple[float, subprocess.CompletedProcess]:
    """Run shardctl in a new process and read its own peak RSS (VmHWM); (seconds, result)."""
    wrapper = Path(config).parent / "shardctl_rss.py"
    wrapper.write_text(RSS_WRAPPER)
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(wrapper), "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    return time.perf_counter() - started, out


NEED_GB = 12  # the fleet's files (~6 GB) plus room for the servers' memory and everyone else's


def scale_dir() -> str | None:
    """Where the fleet goes: $SHARDCTL_SCALE_TMP, else /dev/shm (tmpfs) when it and the memory have room,
    else the system temp dir. On ext4 creating the fleet's ~600,000 relation files is dominated by the
    kernel's inode allocator (bench/README.md), several times slower than tmpfs."""
    return os.environ.get("SHARDCTL_SCALE_TMP") or ram_backed_dir(NEED_GB)


def say(name: str, text: str, figures: dict[str, object]) -> None:
    """Record a figure and print it at once (with -s), so a later failure keeps the earlier figures."""
    figures[name] = text
    print(f"\n[scale] {name}: {text}", flush=True)


@pytest.fixture
def box():
    """Eight servers of the test's own (a directory of its own: the data is several GB)."""
    sandbox = Sandbox(Path(tempfile.mkdtemp(prefix="shardctl-scale65k-", dir=scale_dir())))
    sandbox.up(hosts=HOSTS, shards=HOSTS)
    yield sandbox
    sandbox.destroy()


@pytest.mark.slow
@pytest.mark.timeout(7200)  # the suite's 600 s is for ordinary tests: init alone is minutes here
def test_65536_shards_over_8_hosts(box):
    path = box.topology_path
    path.write_text(topology_text(box))
    figures: dict[str, object] = {}

    seconds, out = timed_cli("init", "--json", config=path)
    assert out.returncode == 0, out.stderr[-2000:]
    rss_mb = int(out.stderr.rsplit("peak-rss-kb ", 1)[1].split()[0]) / 1024
    doc = json.loads(out.stdout)
    assert sum(h["created_count"] for h in doc["hosts"]) == FIRST
    say(
        "init",
        f"{seconds:.1f}s for {FIRST} shards ({FIRST / seconds:.0f} shards/s), jobs "
        f"{sorted({h['jobs'] for h in doc['hosts']})}, peak RSS {rss_mb:.0f} MB",
        figures,
    )
    assert rss_mb <= MAX_RSS_MB

    last = box.state.hosts[-1].name
    started = time.perf_counter()
    added = run_cli("add-shard", "--host", last, "--count", str(ADDED), "--json", config=path)
    assert added.exit_code == 0, added
    say("add-shard", f"{time.perf_counter() - started:.1f}s for {ADDED} shards", figures)
    topo = load(path)
    assert topo.shard_count == TOTAL

    seconds, out = timed_cli("migrate", "--check", config=path)
    assert out.returncode == 0, out.stderr[-2000:]
    say("migrate --check (process)", f"{seconds:.2f}s", figures)

    report = verify(topo)
    assert report.ok, report.to_dict()["violations"][:5]
    assert (
        sum(h.value.shards_checked for h in report.hosts) >= 512 * HOSTS
    )  # sampled: see docs/performance.md
    say(
        "verify",
        f"{report.seconds:.2f}s ({sum(h.value.ids_checked for h in report.hosts)} IDs)",
        figures,
    )
    st = status(topo)
    assert st.ok and sum(h.value.present for h in st.hosts) == TOTAL
    say("status", f"{st.seconds:.2f}s", figures)

    source, target = topo.hosts[0].name, topo.hosts[1].name
    spec = f"0-{MOVED - 1}"
    started = time.perf_counter()
    moved = run_cli("move-shard", spec, "--to", target, "--json", config=path)
    assert moved.exit_code == 0, moved
    cleaned = run_cli("move-shard", spec, "--cleanup", config=path)
    assert cleaned.exit_code == 0, cleaned
    say(f"move of {MOVED} shards + cleanup", f"{time.perf_counter() - started:.1f}s", figures)
    topo = load(path)
    assert (
        topo.host_of(0).name == target and len(topo.host(source).shards) == FIRST // HOSTS - MOVED
    )
    after = verify(topo)
    assert after.ok, after.to_dict()["violations"][:5]
    say("verify after the move", f"{after.seconds:.2f}s", figures)
    print(
        "\n65,536-shard fleet on 8 sandbox hosts: "
        + "; ".join(f"{k} {v}" for k, v in figures.items())
    )
