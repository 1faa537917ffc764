"""The commands that never connect: decode-id, encode-id, locate, info, render.

Run in-process through click's CliRunner against ``shardctl.cli.cli``: CliRunner calls
``cli.main(args=...)``, which is ShardctlGroup.main, so errors go through the same
exit-code mapping (sys.exit) as the real console script. A few cases also run the real
program in a subprocess to check that the exit codes match.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import socket
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from support.process import PYTHON_M, console_script, run_shardctl

from shardctl.cli import cli

BLOG_EPOCH_MS = 1293840000000  # 2011-01-01T00:00:00Z
BLOG_ID = 1387263000 << 23 | 1341 << 10 | 905  # Instagram's worked example

TOPOLOGY = """\
version: 1
id:
  layout: instagram
  epoch: "2011-01-01T00:00:00Z"
  function: plpgsql
shards:
  count: 2000
  schema: "insta{n}"
hosts:
  - name: pg1
    dsn: "postgresql://app@127.0.0.1:1/app"
    password_env: PG1_PASSWORD
    shards: "0-999"
  - name: pg2
    dsn: "host=127.0.0.1 port=1 dbname=app2 user=app"
    shards: "1000-1999"
routing:
  key: user_id
"""

SMALL = """\
version: 1
id:
  layout: custom
  bits: {time: 41, shard: 12, sequence: 10}
  epoch: "2020-01-01T00:00:00Z"
  function: sql
shards:
  count: 8
  schema: "shard{:04d}"
hosts:
  - name: a
    dsn: "postgresql://app@127.0.0.1:1/app"
    shards: "0-3"
  - name: b
    dsn: "postgresql://app@127.0.0.1:1/app2"
    shards: "4-7"
"""


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No connection may be attempted; no stray shardctl.yaml or $SHARDCTL_CONFIG may be picked up."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"an offline command tried to connect: {args!r}")

    monkeypatch.setattr(psycopg, "connect", refuse)
    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(refuse))
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("SHARDCTL_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def topo(tmp_path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(TOPOLOGY)
    return path


@pytest.fixture
def small(tmp_path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return path


def run(args, input=None, env=None):
    result = CliRunner().invoke(cli, [str(a) for a in args], input=input, env=env)
    # Anything but SystemExit escaping main() is a crash (a traceback and exit 1 for a user).
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


def run_json(args, input=None):
    result = run([*args, "--json"], input=input)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # stdout is exactly one JSON document


def errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


# ---- the worked examples on the command line ---------------------------------------------------------


def test_decode_pinterest_worked_example():
    # no topology needed for a foreign layout (and none exists in the working directory)
    result = run(["decode-id", "--layout", "pinterest", "241294492511762325"])
    assert result.exit_code == 0, result.output
    assert "3429" in result.stdout and "7075733" in result.stdout
    doc = run_json(["decode-id", "--layout", "pinterest", "241294492511762325"])
    assert doc == {
        "command": "decode-id",
        "ok": True,
        "errors": [],
        "ids": [{"id": 241294492511762325, "shard": 3429, "type": 1, "local": 7075733}],
    }


def test_encode_instagram_worked_example(topo):
    assert BLOG_ID == 11637205501278089
    result = run(
        [
            "encode-id",
            "--layout",
            "instagram",
            "--epoch",
            "2011-01-01T00:00:00Z",
            "--ms",
            1387263000,
            "--shard",
            31341 % 2000,
            "--sequence",
            5001 % 1024,
        ]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(BLOG_ID)
    # the topology's layout, and --time instead of --ms
    result = run(
        [
            "-c",
            topo,
            "encode-id",
            "--time",
            "2011-01-17T01:21:03Z",
            "--shard",
            1341,
            "--sequence",
            905,
        ]
    )
    assert result.exit_code == 0 and result.stdout.strip() == str(BLOG_ID)
    doc = run_json(
        ["-c", topo, "encode-id", "--ms", 1387263000, "--shard", 1341, "--sequence", 905]
    )
    assert doc == {
        "command": "encode-id",
        "ok": True,
        "layout": "instagram",
        "id": BLOG_ID,
        "ms_since_epoch": 1387263000,
        "shard": 1341,
        "sequence": 905,
        "unix_ms": BLOG_EPOCH_MS + 1387263000,
        "time": "2011-01-17T01:21:03.000Z",
    }


def test_decode_instagram_worked_example(topo):
    doc = run_json(["-c", topo, "decode-id", BLOG_ID])
    assert doc["ok"] is True and doc["errors"] == []
    (parts,) = doc["ids"]
    assert parts == {
        "id": BLOG_ID,
        "ms_since_epoch": 1387263000,
        "shard": 1341,
        "sequence": 905,
        "unix_ms": BLOG_EPOCH_MS + 1387263000,
        "time": "2011-01-17T01:21:03.000Z",
        "schema": "insta1341",
        "host": "pg2",
    }
    result = run(["-c", topo, "decode-id", BLOG_ID])
    assert result.exit_code == 0
    for text in ("2011-01-17T01:21:03.000Z", "1341", "905", "insta1341", "pg2"):
        assert text in result.stdout


def test_locate_worked_example(topo):
    result = run(["-c", topo, "locate", 31341])
    assert result.exit_code == 0, result.output
    assert "1341" in result.stdout and "insta1341" in result.stdout and "pg2" in result.stdout
    doc = run_json(["-c", topo, "locate", 31341])
    assert doc == {
        "command": "locate",
        "ok": True,
        "key": "31341",
        "kind": "integer",
        "rule": "key % 2000",
        "shard": 1341,
        "schema": "insta1341",
        "host": "pg2",
    }


@pytest.mark.parametrize(
    "key,args", [("alice", []), ("31341", ["--string"]), ("²", []), ("--5", [])]
)
def test_locate_string_keys_use_md5(topo, key, args):
    expected = int(hashlib.md5(key.encode()).hexdigest(), 16) % 2000
    doc = json.loads(run(["-c", topo, "locate", "--json", *args, "--", key]).stdout)
    assert doc["kind"] == "string" and doc["rule"] == "md5(key) mod 2000"
    assert doc["shard"] == expected
    assert doc["host"] == ("pg1" if expected < 1000 else "pg2")


def test_locate_negative_integer_key(topo):
    result = run(["-c", topo, "locate", "--", "-5"])
    assert result.exit_code == 2
    assert errors(result) == ["error: integer routing keys are not negative: -5"]


def test_snowflake_decode():
    doc = run_json(["decode-id", "--layout", "snowflake", "1541815603606036480"])
    (parts,) = doc["ids"]
    assert parts["time"] == "2022-06-28T16:07:40.105Z" and parts["unix_ms"] == 1656432460105
    assert (parts["worker"], parts["sequence"]) == (378, 0)
    doc = run_json(
        ["decode-id", "--layout", "snowflake", "--epoch", "0", str((1000 << 22) | (3 << 12) | 7)]
    )
    assert doc["ids"][0]["time"] == "1970-01-01T00:00:01.000Z"
    assert doc["ids"][0]["worker"] == 3 and doc["ids"][0]["sequence"] == 7


def test_custom_layout_round_trip(small):
    value = 123456789 << 22 | 6 << 10 | 1000
    result = run(["-c", small, "encode-id", "--ms", 123456789, "--shard", 6, "--sequence", 1000])
    assert result.exit_code == 0 and result.stdout.strip() == str(value)
    (parts,) = run_json(["-c", small, "decode-id", value])["ids"]
    assert (parts["shard"], parts["sequence"], parts["ms_since_epoch"]) == (6, 1000, 123456789)
    assert (parts["schema"], parts["host"]) == ("shard0006", "b")


def test_pinterest_encode():
    result = run(
        ["encode-id", "--layout", "pinterest", "--shard", 3429, "--type", 1, "--local", 7075733]
    )
    assert result.exit_code == 0 and result.stdout.strip() == "241294492511762325"


# ---- decode-id: bad input ---------------------------------------------------------------------------


def _foreign_shard_id() -> int:
    return 1 << 23 | 5000 << 10 | 1  # shard 5000 fits the layout, not the 2000-shard topology


@pytest.mark.parametrize(
    "given,problem",
    [
        ("abc", "'abc': not an integer ID"),
        ("-1", "'-1': -1 is negative; instagram IDs stay positive until 2045-11-03T19:53:47.776Z"),
        (str(1 << 64), f"'{1 << 64}': {1 << 64} does not fit in 64 bits"),
        ("", "'': empty line"),
        ("  ", "'  ': empty line"),
        (str(_foreign_shard_id()), "shard 5000 is not in this topology (0..1999)"),
        ("12.5", "not an integer ID"),
        ("0x10", "not an integer ID"),
    ],
)
@pytest.mark.parametrize("how", ["argument", "stdin", "csv"])
def test_decode_bad_input(topo, given, problem, how):
    if how == "argument":
        result = run(["-c", topo, "decode-id", given])
    else:
        result = run(
            ["-c", topo, "decode-id", *(["--csv"] if how == "csv" else [])], input=given + "\n"
        )
    assert result.exit_code == 2, result.output
    (line,) = errors(result)
    assert line.startswith("error: line 1: ")
    assert problem.split(": ", 1)[-1].split(" (")[0] in line
    if how != "csv":
        assert problem in line


def test_decode_many_lines_good_and_bad(topo):
    good = [BLOG_ID, 1 << 23 | 0 << 10 | 0, 5 << 23 | 1999 << 10 | 1023]
    lines = [
        str(good[0]),
        "abc",
        str(good[1]),
        "",
        "-1",
        str(1 << 64),
        str(_foreign_shard_id()),
        str(good[2]),
    ]
    stdin = "\n".join(lines) + "\n"

    result = run(["-c", topo, "decode-id"], input=stdin)
    assert result.exit_code == 2
    for value in good:
        assert str(value) in result.stdout  # good lines still decode
    assert [e.split(":")[1].strip() for e in errors(result)] == [
        "line 2",
        "line 4",
        "line 5",
        "line 6",
        "line 7",
    ]

    result = run(["-c", topo, "decode-id", "--json"], input=stdin)
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["ok"] is False
    assert [d["id"] for d in doc["ids"]] == good
    assert [d["shard"] for d in doc["ids"]] == [1341, 0, 1999]
    assert [(e["line"], e["input"]) for e in doc["errors"]] == [
        (2, "abc"),
        (4, ""),
        (5, "-1"),
        (6, str(1 << 64)),
        (7, str(_foreign_shard_id())),
    ]
    assert all(e["error"] for e in doc["errors"])

    result = run(["-c", topo, "decode-id", "--csv"], input=stdin)
    assert result.exit_code == 2
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [int(r["id"]) for r in rows] == good
    assert [int(r["shard"]) for r in rows] == [1341, 0, 1999]
    assert len(errors(result)) == 5


def test_decode_several_arguments_all_good(topo):
    doc = run_json(["-c", topo, "decode-id", BLOG_ID, 1 << 23])
    assert doc["ok"] is True and [d["shard"] for d in doc["ids"]] == [1341, 0]


def test_decode_csv_shape(topo):
    result = run(["-c", topo, "decode-id", "--csv"], input=f"{BLOG_ID}\n{1 << 23}\n")
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows == [
        ["id", "time", "shard", "sequence", "schema", "host"],
        [str(BLOG_ID), "2011-01-17T01:21:03.000Z", "1341", "905", "insta1341", "pg2"],
        [str(1 << 23), "2011-01-01T00:00:00.001Z", "0", "0", "insta0", "pg1"],
    ]
    result = run(["decode-id", "--layout", "pinterest", "--csv", "241294492511762325"])
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "id,shard,type,local",
        "241294492511762325,3429,1,7075733",
    ]


def test_decode_json_shape_with_layout():
    doc = run_json(["decode-id", "--layout", "instagram", str(BLOG_ID)])
    assert list(doc) == ["command", "ok", "ids", "errors"]
    assert set(doc["ids"][0]) == {"id", "ms_since_epoch", "shard", "sequence", "unix_ms", "time"}


def test_decode_option_errors(topo):
    result = run(["-c", topo, "decode-id", "--epoch", "0", "5"])
    assert result.exit_code == 2 and "--epoch goes with --layout" in result.stderr
    result = run(["decode-id", "--layout", "snowflake", "--epoch", "soon", "5"])
    assert result.exit_code == 2 and "--epoch: not an ISO-8601 timestamp" in result.stderr
    result = run(["decode-id", "--layout", "snowflake", "--epoch", str(10**18), "5"])
    assert result.exit_code == 2 and "outside the years 1-9999" in result.stderr
    result = run(["decode-id", "--layout", "twitter", "5"])
    assert result.exit_code == 2 and "twitter" in result.stderr


# ---- encode-id: bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["--ms", 1, "--shard", 8192, "--sequence", 0],
            "shard 8192 does not fit in 13 bits (0..8191)",
        ),
        (["--ms", 1, "--shard", 0, "--sequence", 1024], "sequence 1024 does not fit in 10 bits"),
        (["--ms", -1, "--shard", 0], "time -1 does not fit"),
        (["--time", "2010-12-31T23:59:59Z", "--shard", 0], "time -1000 does not fit"),
        (["--shard", 1], "layout instagram needs --time or --ms"),
        (["--ms", 1, "--time", "2012-01-01", "--shard", 1], "give --time or --ms, not both"),
        (["--time", "noon", "--shard", 1], "--time: not an ISO-8601 timestamp"),
        (["--ms", 1, "--worker", 1], "layout instagram has no field worker"),
        (["--ms", 1, "--epoch", "0"], "--epoch goes with --layout"),
        (["--ms", "x"], "'x' is not a valid integer"),
    ],
)
def test_encode_bad_input(topo, args, needle):
    result = run(["-c", topo, "encode-id", *args])
    assert result.exit_code == 2, result.output
    assert needle in result.stderr
    assert result.stdout == ""


# ---- info ------------------------------------------------------------------------------------------------------


def test_info(topo):
    result = run(["-c", topo, "info"])
    assert result.exit_code == 0
    for text in (
        "instagram",
        "41 time | 13 shard | 10 sequence",
        "8192",
        "1024",
        "2045-11-03T19:53:47.776Z",
        "2080-09-06T15:47:35.552Z",
        "pg1",
        "0-999",
        "1000-1999",
    ):
        assert text in result.stdout, text
    doc = run_json(["-c", topo, "info"])
    assert doc["shard_count"] == 2000 and doc["routing_modulus"] == 2000
    assert doc["limits"]["max_shards"] == 8192 and doc["limits"]["ids_per_ms_per_shard"] == 1024
    assert [h["name"] for h in doc["hosts"]] == ["pg1", "pg2"]
    assert doc["warnings"] and "2045-11-03T19:53:47.776Z" in doc["warnings"][0]


def test_info_masks_inline_passwords(tmp_path):
    path = tmp_path / "pw.yaml"
    path.write_text(
        TOPOLOGY.replace(
            "postgresql://app@127.0.0.1:1/app", "postgresql://app:Hunter2Secret@127.0.0.1:1/app"
        ).replace("dbname=app2 user=app", "dbname=app2 user=app password=Hunter2Other")
    )
    for extra in ([], ["--json"]):
        result = run(["-c", path, "--allow-inline-password", "info", *extra])
        assert result.exit_code == 0, result.output
        assert "Hunter2" not in result.output
    doc = json.loads(result.stdout)
    assert doc["hosts"][0]["dsn"] == "postgresql://app:***@127.0.0.1:1/app"
    assert doc["hosts"][1]["dsn"] == "host=127.0.0.1 port=1 dbname=app2 user=app password=***"


# ---- render -----------------------------------------------------------------------------------------------------


def test_render_one_shard(small):
    result = run(["-c", small, "render", "--shard", 5, "--no-migrations", "--no-control"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "-- ===== host b =====" in out and "host a" not in out
    assert "CREATE SCHEMA shard0005;" in out and "shard0004" not in out
    assert "CREATE SEQUENCE shard0005.next_id_seq CACHE 1;" in out
    assert "CREATE OR REPLACE FUNCTION shard0005.next_id()" in out
    assert "CREATE SCHEMA IF NOT EXISTS shardctl" not in out


def test_render_json(small):
    doc = run_json(["-c", small, "render"])
    assert set(doc["hosts"]) == {"a", "b"}
    assert set(doc["hosts"]["a"]["shards"]) == {"0", "1", "2", "3"}
    assert "CREATE SCHEMA IF NOT EXISTS shardctl;" in doc["hosts"]["a"]["control"]
    sql = doc["hosts"]["b"]["shards"]["7"]
    assert "CREATE SCHEMA shard0007;" in sql and "-- migration V0001__" in sql
    doc = run_json(
        ["-c", small, "render", "--host", "a", "--shard", "2-5", "--no-control", "--no-migrations"]
    )
    assert list(doc["hosts"]) == ["a"] and set(doc["hosts"]["a"]["shards"]) == {"2", "3"}
    assert (
        doc["hosts"]["a"]["control"] is None and "migration" not in doc["hosts"]["a"]["shards"]["2"]
    )


def test_render_is_deterministic(small):
    first, second = run(["-c", small, "render"]), run(["-c", small, "render"])
    assert first.exit_code == 0 and first.stdout == second.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--shard", 8], "--shard: shard 8 is out of range (0..7)"),
        (["--shard", "x"], "--shard: not a shard number or range"),
        (["--host", "c"], "unknown host 'c' (hosts: a, b)"),
    ],
)
def test_render_bad_input(small, args, needle):
    result = run(["-c", small, "render", *args])
    assert result.exit_code == 2 and needle in result.stderr


def test_render_migration_error_is_bad_input(small, tmp_path):
    migrations = tmp_path / "migs"
    migrations.mkdir()
    (migrations / "V0001__broken.sql").write_text("CREATE TABLE {{ shema }}.t ();\n")
    small.write_text(SMALL + "migrations: migs/\n")
    result = run(["-c", small, "render"])
    assert result.exit_code == 2
    assert "V0001__broken.sql" in result.stderr and "'shema' is undefined" in result.stderr


def test_render_template_error_is_bad_input(small, tmp_path):
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "shard.sql.j2").write_text("CREATE SCHEMA {{ schema_name }};\n")
    small.write_text(SMALL + "templates: tpl/\n")
    result = run(["-c", small, "render"])
    assert result.exit_code == 2
    assert errors(result) == [
        "error: template shard.sql.j2:1 does not render: 'schema_name' is undefined"
    ]


# ---- --json everywhere --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["info"],
        ["locate", "31341"],
        ["locate", "--string", "alice"],
        ["decode-id", str(BLOG_ID)],
        ["decode-id", "--layout", "pinterest", "241294492511762325"],
        ["encode-id", "--ms", "1387263000", "--shard", "1341", "--sequence", "905"],
        ["render", "--shard", "0-1"],
    ],
)
def test_every_offline_command_speaks_json(topo, args):
    doc = run_json(["-c", topo, *args])
    assert isinstance(doc, dict) and doc


# ---- exit codes and usage errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,code",
    [
        (["no-such-command"], 2),
        (["decode-id", "--layout", "nope", "5"], 2),
        (["encode-id", "--shard"], 2),
        (["--version"], 0),
        (["--help"], 0),
        (["decode-id", "--help"], 0),
    ],
)
def test_usage_exit_codes(args, code):
    assert run(args).exit_code == code


CASES = {
    "decode-ok": (["decode-id", "--layout", "pinterest", "241294492511762325"], 0),
    "decode-negative": (["-c", "{topo}", "decode-id", "-1"], 2),
    "encode-range": (["-c", "{topo}", "encode-id", "--ms", "1", "--shard", "9000"], 2),
    "bad-config": (["-c", "{bad}", "info"], 2),
    "usage": (["no-such-command"], 2),
}
# The console script is checked on a few cases only: each process start costs ~0.3 s.
# (A missing config file is covered by test_real_process_json_error_document.)
SCRIPT_CASES = ("decode-ok", "bad-config")


def _check_same_as_clirunner(command, case, topo, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TOPOLOGY.replace("count: 2000", "count: 9000"))
    names = {"topo": str(topo), "missing": str(tmp_path / "missing.yaml"), "bad": str(bad)}
    args, code = CASES[case]
    args = [a.format(**names) for a in args]
    real = run_shardctl(
        *args, command=command, unset=("SHARDCTL_CONFIG",), cwd=tmp_path, timeout=60
    )
    inproc = run(args)
    assert real.returncode == inproc.exit_code == code, (args, real.stderr)
    assert "Traceback" not in real.stderr
    if code == 2:
        real_errors = [x for x in real.stderr.splitlines() if x.startswith(("error:", "Error:"))]
        in_errors = [x for x in inproc.stderr.splitlines() if x.startswith(("error:", "Error:"))]
        assert real_errors and real_errors == in_errors, args
    else:
        assert real.stdout == inproc.stdout


@pytest.mark.parametrize("case", list(CASES))
def test_python_m_exit_codes_match_clirunner(topo, tmp_path, case):
    _check_same_as_clirunner(PYTHON_M, case, topo, tmp_path)


@pytest.mark.parametrize("case", SCRIPT_CASES)
def test_console_script_exit_codes_match_clirunner(topo, tmp_path, case):
    script = console_script()
    if script is None:
        pytest.skip("the shardctl console script is not installed next to this Python")
    _check_same_as_clirunner([script], case, topo, tmp_path)


def test_real_process_json_error_document(tmp_path):
    real = run_shardctl(
        "-c",
        tmp_path / "missing.yaml",
        "info",
        "--json",
        unset=("SHARDCTL_CONFIG",),
        cwd=tmp_path,
        timeout=60,
    )
    assert real.returncode == 2
    doc = json.loads(real.stdout)
    assert (
        doc["ok"] is False and doc["exit_code"] == 2 and "topology file not found" in doc["error"]
    )


def test_real_process_reads_stdin_and_env(topo, tmp_path):
    real = run_shardctl(
        "decode-id",
        "--csv",
        env={"SHARDCTL_CONFIG": str(topo)},
        input=f"{BLOG_ID}\nabc\n",
        cwd=tmp_path,
        timeout=60,
    )
    assert real.returncode == 2
    assert real.stdout.splitlines()[1].startswith(
        f"{BLOG_ID},2011-01-17T01:21:03.000Z,1341,905,insta1341,pg2"
    )
    assert "error: line 2: 'abc': not an integer ID" in real.stderr


def test_json_error_document_in_process(tmp_path):
    result = run(["-c", tmp_path / "missing.yaml", "info", "--json"])
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2
