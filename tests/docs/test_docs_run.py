"""The docs are tests: every shell and Python block of the README and docs/*.md runs as written.

Each page runs in a directory of its own (``shardctl sandbox up``, ``shardctl demo`` for real), its
blocks in order in one shell session and one Python session (tests/support/docs_runner.py), then its
sandboxes are stopped. A block marked on the line above as an excerpt, needing an external host, or
another reason of tests/support/docs_blocks.py's ``SKIPS`` is left out, and listed at the end of the
run. A block marked ``check NAME`` is followed by the check NAME below, which asserts what the page
says the block did. Run with ``make test-docs`` (the ``docs`` marker; not in the default suite).
"""

from __future__ import annotations

import ast
import csv
import io
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict
from support.docs_blocks import ROOT, Block, page_blocks, pages
from support.docs_runner import BlockFailed, PageRun, remove

from shardctl import Router, Topology

PSQL = shutil.which("psql") or "/usr/bin/psql"

pytestmark = pytest.mark.docs

PAGES = [p.relative_to(ROOT).as_posix() for p in pages()]
# Pages whose blocks another branch of the same issue is fixing, with the block that fails. Strict:
# once the page runs as written, its entry must go.
PENDING = {}


def page_param(page: str):
    if page not in PENDING:
        return page
    return pytest.param(
        page, marks=pytest.mark.xfail(strict=True, raises=BlockFailed, reason=PENDING[page])
    )


@pytest.mark.parametrize("page", [page_param(p) for p in PAGES])
def test_page_runs_as_written(page):
    blocks = page_blocks(ROOT / page)
    unknown = {name for b in blocks for name in b.checks} - set(CHECKS)
    assert not unknown, f"{page}: no check named {sorted(unknown)}"
    directory = Path(tempfile.mkdtemp(prefix="docs-"))  # short: sockets live under it
    run = PageRun(directory)
    try:
        for block in blocks:
            if block.skip is not None:
                continue
            try:
                run_block(run, block)
            except BlockFailed as exc:
                if page in PENDING:
                    raise
                raise BlockFailed(f"{exc}\n(the page's directory is kept: {directory})") from None
    finally:
        problems = run.close()
        if page in PENDING:
            remove(directory)
    assert not problems, problems
    remove(directory)


def run_block(run: PageRun, block: Block) -> None:
    """The block, then its checks; a check that fails names the block's page and line too."""
    run.run(block)
    for name in block.checks:
        try:
            CHECKS[name](run, block)
        except AssertionError as exc:
            raise BlockFailed(
                f"{block.where}: the block ran, but check {name!r} failed: {exc}"
            ) from exc


# ---- checks: what a page says a block did, asserted from the servers and files themselves ---------
# Each reads the sandbox's own records (sandbox.json, pgbouncer.ini) and asks the servers and
# PgBouncer with psql, not through shardctl's code.


def psql(port: int, dbname: str, sql: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PSQL, "--csv", "-X", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", "-p", str(port)]
        + ["-h", "127.0.0.1", "-U", "postgres", "-d", dbname],
        input=sql,
        capture_output=True,
        text=True,
        check=check,
        timeout=30,
    )


def rows(port: int, dbname: str, sql: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(psql(port, dbname, sql).stdout)))


def server_ports(sandbox: Path) -> dict[str, int]:
    state = json.loads((sandbox / "sandbox.json").read_text())
    return {h["name"]: int(h["port"]) for h in state["hosts"]}


def shard_bits(id_: int, sandbox: Path) -> int:
    """The shard inside an ID, by the bit widths the sandbox's topology file names (read here with
    PyYAML, not with shardctl's layout code): time | shard | sequence, Instagram's 13 and 10 when the
    file names the plain ``instagram`` layout."""
    ids = yaml.safe_load((sandbox / "shardctl.yaml").read_text())["id"]
    bits = ids.get("bits") or {"shard": 13, "sequence": 10}
    return (id_ >> bits["sequence"]) & ((1 << bits["shard"]) - 1)


def check_printed(run: PageRun, block: Block) -> None:
    """What the block printed is what the comments of its ``print(...)`` lines say, line by line
    (a comment may go on after the value: ``# {2: 'pg2'}: followed ...``)."""
    said = [
        line.split("  # ", 1)[1]
        for line in block.text.splitlines()
        if line.strip().startswith("print(") and "  # " in line
    ]
    printed = run.output().splitlines()
    assert len(printed) == len(said), (printed, said)
    for out, comment in zip(printed, said):
        assert comment.startswith(out.strip()), f"printed {out!r}, the page says {comment!r}"


def shard_rows(port: int, shards: range, table: str) -> list[tuple[int, int]]:
    """(shard, id) of every row of ``table`` in the given shards' schemas on one server."""
    union = " UNION ALL ".join(f"SELECT {n} AS shard, id FROM insta{n}.{table}" for n in shards)
    return [(int(r["shard"]), int(r["id"])) for r in rows(port, "app", union)]


def check_demo(run: PageRun, block: Block) -> None:
    """README, index.md: the demo made 256 shards on two servers and wrote rows whose IDs decode to
    the shard that holds them."""
    demo = Path(run.cwd) / "shardctl-demo"
    ports = server_ports(demo)
    assert sorted(ports) == ["pg1", "pg2"]
    found = []
    for name, shards in (("pg1", range(128)), ("pg2", range(128, 256))):
        assert shard_schemas(ports[name], "users") == len(shards), name
        found += shard_rows(ports[name], shards, "users") + shard_rows(
            ports[name], shards, "photos"
        )
    assert len(found) >= 6, found  # a handful of users, with photos
    assert all(shard_bits(id_, demo) == shard for shard, id_ in found), found


def shard_schemas(port: int, table: str) -> int:
    """How many insta<N> schemas on the server have ``table``."""
    [row] = rows(
        port,
        "app",
        "SELECT count(*) AS n FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace"
        f" WHERE s.nspname ~ '^insta[0-9]+$' AND c.relname = '{table}' AND c.relkind = 'r'",
    )
    return int(row["n"])


def check_fleet(run: PageRun, block: Block) -> None:
    """README: init made 1024 shards over the two hosts, each with every migration's tables."""
    ports = server_ports(Path(run.cwd) / "fleet")
    assert [shard_schemas(ports[name], "likes") for name in ("pg1", "pg2")] == [512, 512]


def check_readme_photo(run: PageRun, block: Block) -> None:
    """README: the row is in user 42's shard, with an ID from that shard's next_id()."""
    sandbox = Path(run.cwd) / "fleet"
    found = rows(
        server_ports(sandbox)["pg1"], "app", "SELECT id FROM insta42.photos WHERE user_id = 42"
    )
    assert len(found) == 1, found
    assert shard_bits(int(found[0]["id"]), sandbox) == 42


def check_add_shard(run: PageRun, block: Block) -> None:
    """architecture.md: add_shard opened shards 64-127 on pg2 and wrote the topology."""
    check_printed(run, block)  # 64-127 128
    topo = yaml.safe_load((Path(run.cwd) / "shardctl.yaml").read_text())
    assert topo["shards"]["count"] == 128
    [schemas] = rows(
        server_ports(Path(run.cwd))["pg2"],
        "app",
        "SELECT count(*) AS n FROM pg_namespace WHERE nspname ~ '^insta[0-9]+$'"
        " AND substr(nspname, 6)::int BETWEEN 64 AND 127",
    )
    assert int(schemas["n"]) == 64


def check_stats(run: PageRun, block: Block) -> None:
    """router.md: stats() has the keys the page shows (the standby's own aside)."""
    shown = ast.literal_eval(block.text.split("}  #", 1)[0] + "}")["pg1"]
    with Router(Topology.load(Path(run.cwd) / "shardctl.yaml")) as router:
        router.execute(1, "SELECT 1")
        real = router.stats()["pg1"]
    assert set(shown) == set(real), set(shown) ^ set(real)
    for key in ("breaker", "latency_ms"):
        assert set(shown[key]) == set(real[key]), key


def pooler_in_front(sandbox: Path, mode: str, pool_size: int) -> int:
    """Each host's dsn is PgBouncer's database named after the host, its admin_dsn the server, its
    pooler the mode; PgBouncer sends that database to that server. Returns PgBouncer's port."""
    servers = server_ports(sandbox)
    ini = (sandbox / "pgbouncer" / "pgbouncer.ini").read_text()
    port = int(re.search(r"^listen_port = (\d+)$", ini, re.MULTILINE).group(1))
    topo = yaml.safe_load((sandbox / "shardctl.yaml").read_text())
    assert {h["name"] for h in topo["hosts"]} == set(servers)
    for host in topo["hosts"]:
        dsn, admin = conninfo_to_dict(host["dsn"]), conninfo_to_dict(host["admin_dsn"])
        assert (int(dsn["port"]), dsn["dbname"]) == (port, host["name"]), host
        assert int(admin["port"]) == servers[host["name"]], host
        assert host["pooler"] == mode, host
    routes = {r["name"]: int(r["port"]) for r in rows(port, "pgbouncer", "SHOW DATABASES")}
    assert {name: routes[name] for name in servers} == servers
    config = {r["key"]: r["value"] for r in rows(port, "pgbouncer", "SHOW CONFIG")}
    assert (config["pool_mode"], int(config["default_pool_size"])) == (mode, pool_size)
    return port


def check_pooler(run: PageRun, block: Block) -> None:
    pooler_in_front(Path(run.cwd) / "fleet", "transaction", 3)


def check_pooler_existing(run: PageRun, block: Block) -> None:
    """testing.md: the sandbox made before keeps its shards, now served through PgBouncer."""
    port = pooler_in_front(Path(run.cwd) / "sandbox", "transaction", 10)
    check_printed(run, block)  # [(0,)]
    stats = {
        r["database"]: int(r["total_xact_count"]) for r in rows(port, "pgbouncer", "SHOW STATS")
    }
    assert stats["pg1"] >= 1, stats


def check_stale_router(run: PageRun, block: Block) -> None:
    """moving-shards.md: the app's copy still names pg1, yet the row is in shard 2 on pg2; a direct
    client of pg1's old schema is told where the shard went."""
    fleet = Path(run.cwd)
    copy = yaml.safe_load((fleet / "app-copy.yaml").read_text())
    assert [h["shards"] for h in copy["hosts"]] == ["0-7", "8-15"], copy["hosts"]
    check_printed(run, block)  # {2: 'pg2'}
    ports = server_ports(fleet)
    moved = rows(ports["pg2"], "app", "SELECT user_id FROM insta2.photos WHERE caption = 'moved'")
    assert moved == [{"user_id": "2"}]
    direct = psql(ports["pg1"], "app", "SELECT count(*) FROM insta2.photos", check=False)
    assert direct.returncode != 0
    assert "SCM01: shard 2 moved to pg2" in direct.stderr, direct.stderr


def check_adopt_blocker(run: PageRun, block: Block) -> None:
    """adopting.md: the first plan names blockers and exits 1, and still writes the plan file."""
    assert "adopt plan: exit 1" in run.output(), run.output()
    plan = yaml.safe_load((Path(run.cwd) / "adopt-plan.yaml").read_text())
    assert plan["blockers"] and all(b["fix"] for b in plan["blockers"]), plan["blockers"]


def fleet_rows(fleet: Path, topo: dict, table: str, key: str) -> dict[int, tuple[int, int]]:
    """id -> (shard, key) of every row of ``table`` in the fleet's shard schemas (read with psql);
    an id in two shards fails."""
    ports = server_ports(fleet)
    found: dict[int, tuple[int, int]] = {}
    for host in topo["hosts"]:
        first, _, last = str(host["shards"]).partition("-")
        shards = range(int(first), int(last or first) + 1)
        union = " UNION ALL ".join(
            f"SELECT {n} AS shard, id, {key} AS key FROM insta{n}.{table}" for n in shards
        )
        for r in rows(ports[host["name"]], "app", union):
            assert int(r["id"]) not in found, f"{table} id {r['id']} on two shards"
            found[int(r["id"])] = (int(r["shard"]), int(r["key"]))
    return found


def check_adopt_cutover(run: PageRun, block: Block) -> None:
    """adopting.md: after the cutover the fleet is authoritative; every row of every adopted table
    on the old database (frozen since) is on the fleet once, on its key's shard (an old key: key %
    count), and the app, which ran through the cutover, wrote new rows there (next_id() IDs, on
    their key's shard)."""
    here = Path(run.cwd)
    topo = yaml.safe_load((here / "fleet" / "shardctl.yaml").read_text())
    adoption, count = topo["adoption"], topo["shards"]["count"]
    assert adoption["authoritative"] == "fleet", adoption
    floor = int(adoption["id_floor"])
    old_port = server_ports(here / "olddb")["pg1"]
    new_rows = 0
    for table, cols in adoption["tables"].items():
        old = {  # the rows of before the cutover (the way back for --abort brings later ones),
            # moved to schema shardctl_adopted at the cutover (stubs raise SCM01 under the old names)
            int(r["id"]): int(r["key"])
            for r in rows(
                old_port,
                "app",
                f"SELECT id, {cols['key']} AS key FROM shardctl_adopted.{table} WHERE id < {floor}",
            )
        }
        fleet = fleet_rows(here / "fleet", topo, table, cols["key"])
        assert {i: k for i, (_, k) in fleet.items() if i < floor} == old, table
        for i, (shard, k) in fleet.items():
            want = k % count if k < floor else shard_bits(k, here / "fleet")
            assert shard == want, (table, i, shard, k)
        new_rows += sum(1 for i in fleet if i >= floor)
    assert new_rows > 0, "the app wrote nothing to the fleet after the cutover"


CHECKS = {
    "printed": check_printed,
    "demo": check_demo,
    "fleet": check_fleet,
    "stale-router": check_stale_router,
    "readme-photo": check_readme_photo,
    "add-shard": check_add_shard,
    "stats": check_stats,
    "pooler": check_pooler,
    "pooler-existing": check_pooler_existing,
    "adopt-blocker": check_adopt_blocker,
    "adopt-cutover": check_adopt_cutover,
}
