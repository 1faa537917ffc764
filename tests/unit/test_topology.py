"""The topology file: every validation rule, through the API and through the CLI.

A bad file exits 2 with ``path:LINE: problem`` on stderr and never connects anywhere:
the DSNs point at 127.0.0.1:1 and the ``no_network`` fixture makes any socket or
psycopg connection attempt fail the test.
"""

from __future__ import annotations

import json
import socket
import sys
import warnings
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from shardctl.cli import cli
from shardctl.errors import BadInput, ConfigError, ConfigErrors
from shardctl.model.topology import LayoutWarning, Topology

GOOD = """\
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
    standby: "postgresql://app@127.0.0.1:1/standby"
    shards: "0-999"
  - name: pg2
    dsn: "host=127.0.0.1 port=1 dbname=app2 user=app"
    shards: "1000-1999"
templates: templates/
migrations: migrations/
routing:
  key: user_id
  strings: md5
"""

CUSTOM = GOOD.replace(
    "  layout: instagram\n", "  layout: custom\n  bits: {time: 41, shard: 12, sequence: 10}\n"
)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Validation happens before any connection: fail loudly if anything tries to connect."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"an offline command tried to connect: {args!r}")

    monkeypatch.setattr(psycopg, "connect", refuse)
    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(refuse))
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("SHARDCTL_CONFIG", raising=False)


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based number of the ``nth`` line of ``text`` that contains ``needle``."""
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(hits) >= nth, f"{needle!r} not in the test topology"
    return hits[nth - 1]


def run(args, input=None, env=None):
    """Invoke the real click group; ShardctlGroup.main turns errors into sys.exit(code)."""
    result = CliRunner().invoke(cli, args, input=input, env=env)
    # Any exception other than SystemExit is a crash (traceback, exit 1), never an acceptable answer.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


def check_bad(
    tmp_path: Path,
    text: str,
    *needles: str,
    line: int | None = None,
    extra_args: tuple[str, ...] = (),
) -> str:
    """``shardctl info`` on ``text`` exits 2; stderr has ``path:line:`` and every needle. Returns stderr."""
    path = tmp_path / "shardctl.yaml"
    path.write_text(text)
    result = run(["--config", str(path), *extra_args, "info"])
    assert result.exit_code == 2, result.output
    err = result.stderr
    assert result.stdout == ""  # no half-printed info
    if line is not None:
        assert f"{path}:{line}: " in err, err
    for needle in needles:
        assert needle in err, err
    with pytest.raises(ConfigError):  # and the API says the same
        Topology.load(path)
    return err


def test_good_topology_loads():
    import shardctl.model.topology as topology_module

    topology_module._WARNED.clear()
    with pytest.warns(LayoutWarning, match="turn negative on 2045-11-03T19:53:47.776Z"):
        topo = Topology.from_text(GOOD, path="/etc/shardctl/shardctl.yaml")
    with (
        warnings.catch_warnings()
    ):  # said once per process (a Router reloads its file after every move) ...
        warnings.simplefilter("error", LayoutWarning)
        again = Topology.from_text(GOOD, path="/etc/shardctl/shardctl.yaml")
    assert (
        again.warnings == topo.warnings != []
    )  # ... and still on every topology, for info and verify
    assert topo.shard_count == 2000 and topo.modulus == 2000
    assert [h.name for h in topo.hosts] == ["pg1", "pg2"]
    assert topo.host_of(0).name == "pg1" and topo.host_of(1999).name == "pg2"
    assert topo.host("pg2").shards == list(range(1000, 2000))
    assert topo.schema_name(5) == "insta5"
    assert topo.hosts[0].password_env == "PG1_PASSWORD"
    assert topo.hosts[0].standby == "postgresql://app@127.0.0.1:1/standby"
    assert topo.templates_dir == Path("/etc/shardctl/templates")
    assert topo.migrations_dir == Path("/etc/shardctl/migrations")
    assert topo.routing_key == "user_id" and topo.string_hash == "md5"
    with pytest.raises(BadInput, match="shard 2000 is not in this topology"):
        topo.host_of(2000)
    with pytest.raises(BadInput, match="unknown host 'pg3'"):
        topo.host("pg3")
    summary = topo.summary()
    assert summary["hosts"][0] == {
        "name": "pg1",
        "dsn": "postgresql://app@127.0.0.1:1/app",
        "shards": "0-999",
        "shard_count": 1000,
    }
    assert summary["limits"]["negative_at"] == "2045-11-03T19:53:47.776Z"


def test_a_layout_warning_points_at_the_callers_line(tmp_path):
    """In library use the 64-bit warning names the application's line, not one inside shardctl."""
    import shardctl.model.topology as topology_module

    topology_module._WARNED.clear()
    path = tmp_path / "shardctl.yaml"
    path.write_text(GOOD)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LayoutWarning)
        line = sys._getframe().f_lineno + 1
        Topology.load(path)
    assert [(w.category, w.filename, w.lineno) for w in caught] == [(LayoutWarning, __file__, line)]


def test_the_sandbox_topology_warns_about_nothing(tmp_path):
    """What ``sandbox up`` and ``demo`` write: a 63-bit split that keeps 8192 shards, so init,
    verify and info have nothing to warn about."""
    from shardctl.dev.sandbox import SandboxHost, SandboxState, topology_text

    state = SandboxState("/nowhere", hosts=[SandboxHost("pg1", 5432, "/nowhere/pg1")])
    path = tmp_path / "shardctl.yaml"
    path.write_text(topology_text(state, 8192, "plpgsql", "2026-01-01T00:00:00Z"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutWarning)
        topo = Topology.load(path)
    assert topo.warnings == [] and topo.layout.limits()["negative_at"] is None
    assert topo.layout.max_shards == 8192 and topo.layout.ids_per_ms_per_shard == 512
    result = run(["--config", str(path), "info"])
    assert result.exit_code == 0 and "warning" not in result.stderr, result.stderr


def test_custom_63_bit_layout_has_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutWarning)
        topo = Topology.from_text(CUSTOM)
    assert topo.layout.name == "custom" and topo.warnings == []
    assert topo.layout.max_shards == 4096


def test_shards_as_lists_numbers_and_empty():
    text = GOOD.replace('shards: "0-999"', 'shards: [0, "1-998", 999]').replace(
        'shards: "1000-1999"',
        'shards: 1000-1999\n  - name: spare\n    dsn: "host=127.0.0.1 port=1"\n    shards: []',
    )
    topo = Topology.from_text(text)
    assert topo.host("pg1").shards == list(range(1000))
    assert topo.host("spare").shards == []


def test_sixty_four_bit_layout_warns_on_the_command_line(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(GOOD)
    result = run(["--config", str(path), "info"])
    assert result.exit_code == 0
    assert (
        "warning" in result.stderr and "turn negative on 2045-11-03T19:53:47.776Z" in result.stderr
    )
    assert "2045-11-03T19:53:47.776Z" in result.stdout  # info shows the limit too
    path.write_text(CUSTOM)
    result = run(["--config", str(path), "info"])
    assert result.exit_code == 0 and "warning" not in result.stderr


# ---- every shard owned by exactly one host -------------------------------------------------------


def test_gap_is_reported_by_number(tmp_path):
    text = GOOD.replace('"0-999"', '"0-499,501-989"')
    err = check_bad(
        tmp_path, text, "shards 500,990-999 are owned by no host", line=line_of(text, "hosts:")
    )
    assert "500" in err


def test_overlap_is_reported_by_number(tmp_path):
    text = GOOD.replace('"1000-1999"', '"990-1999"')
    check_bad(
        tmp_path, text, "shards 990-999 are owned by both pg1 and pg2", line=line_of(text, "hosts:")
    )


def test_same_host_listing_a_shard_twice(tmp_path):
    text = GOOD.replace('"0-999"', '"0-999,5"')
    check_bad(tmp_path, text, "shard 5 is listed twice", line=line_of(text, '"0-999,5"'))


def test_shard_beyond_count(tmp_path):
    text = GOOD.replace('"1000-1999"', '"1000-2000"')
    check_bad(
        tmp_path, text, "shard 2000 is out of range (0..1999)", line=line_of(text, '"1000-2000"')
    )


# ---- host names ------------------------------------------------------------------------------------


def test_duplicate_host_names(tmp_path):
    text = GOOD.replace("name: pg2", "name: pg1")
    check_bad(
        tmp_path,
        text,
        "host name 'pg1' is used twice (first at line 10)",
        line=line_of(text, "name: pg1", 2),
    )


def test_host_without_name_dsn_or_shards(tmp_path):
    text = GOOD.replace("  - name: pg2\n", '  - standby: "host=127.0.0.1"\n')
    check_bad(tmp_path, text, "hosts[1] needs a name")
    text = GOOD.replace('    dsn: "host=127.0.0.1 port=1 dbname=app2 user=app"\n', "")
    check_bad(tmp_path, text, "host pg2 needs a dsn")
    text = GOOD.replace('    shards: "1000-1999"\n', "")
    check_bad(tmp_path, text, "host pg2 needs 'shards'")


# ---- shard count vs layout bits --------------------------------------------------------------------


def test_count_must_fit_the_shard_bits(tmp_path):
    text = GOOD.replace("count: 2000", "count: 8193").replace('"1000-1999"', '"1000-8192"')
    check_bad(
        tmp_path,
        text,
        "shards.count 8193 does not fit the instagram layout's 13 shard bits (at most 8192)",
        line=line_of(text, "count: 8193"),
    )
    text = CUSTOM.replace("count: 2000", "count: 4097").replace('"1000-1999"', '"1000-4096"')
    check_bad(tmp_path, text, "12 shard bits (at most 4096)", line=line_of(text, "count: 4097"))


def test_count_at_the_limit_is_fine():
    text = GOOD.replace("count: 2000", "count: 8192").replace('"1000-1999"', '"1000-8191"')
    assert Topology.from_text(text).shard_count == 8192


@pytest.mark.parametrize("count", ["0", "-4", "abc", "2.5", "true", "null"])
def test_count_must_be_a_positive_integer(tmp_path, count):
    text = GOOD.replace("count: 2000", f"count: {count}")
    check_bad(
        tmp_path, text, "shards.count must be a positive integer", line=line_of(text, "count:")
    )


def test_huge_range_with_unusable_count_is_quick(tmp_path):
    # Without a count the ranges are checked against the layout, not expanded to 10**11 numbers.
    text = GOOD.replace("count: 2000", "count: abc").replace('"0-999"', '"0-99999999999"')
    check_bad(
        tmp_path,
        text,
        "shards.count must be a positive integer",
        "shard 99999999999 is out of range",
    )


# ---- schema names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,needle",
    [
        ("Insta{n}", "'Insta0' for shard 0, which must be lower-case"),
        (
            "{n}",
            "'0' for shard 0, which must be lower-case letters, digits and underscores, not starting with a digit",
        ),
        ("insta-{n}", "'insta-0' for shard 0"),
        ("in sta{n}", "'in sta0'"),
        ("x{n}; DROP SCHEMA public", "must be lower-case"),
        ("x{n}$$", "'x0$$'"),
        ("x{n}'", "must be lower-case"),
        ("é{n}", "must be lower-case"),
        ("a" * 60 + "{n:04d}", "is 64 bytes long (PostgreSQL keeps at most 63)"),
        (
            "a" * 62 + "{n}",
            "for shard 10, which is 64 bytes long",
        ),  # only the longer numbers overflow
        ("do{n!s:.0}", "'do' for shard 0, which is a reserved SQL key word"),
        ("select{n!s:.0}", "reserved SQL key word"),
        ("pg_{n}", "starts with pg_"),
        ("public{n!s:.0}", "is a schema PostgreSQL or shardctl already uses"),
        ("shardctl{n!s:.0}", "already uses"),
        ("insta", "must contain the shard number"),
        ("x{n!s:.1}", "gives the same schema 'x1' to shards 1 and 10"),
        ("x{n!s:.0}", "gives the same schema 'x' to shards 0 and 1"),
        ("x{shard}", "may only use {n}"),
        ("x{0}", "may only use {n}"),
        ("x{n.real}", "may only use {n}"),
        ("x{n", "not a valid format string"),
        ("x{n:q}", "cannot format a shard number"),
        ("x{}{}", "cannot format a shard number"),
        ("x{n:{n.x}}", "cannot format a shard number"),
        ("x{n:999999999}", "pads the shard number beyond 63 bytes"),
    ],
)
def test_bad_schema_formats(tmp_path, fmt, needle):
    text = GOOD.replace('schema: "insta{n}"', f"schema: {json.dumps(fmt)}")
    check_bad(tmp_path, text, needle, line=line_of(text, "schema:"))


def test_schema_with_trailing_newline_is_refused(tmp_path):
    # regression: the identifier pattern used "$", which also matches before a final "\n"
    text = GOOD.replace('schema: "insta{n}"', 'schema: "insta{n}\\n"')
    check_bad(tmp_path, text, "must be lower-case", line=line_of(text, "schema:"))


@pytest.mark.parametrize(
    "fmt,name",
    [("insta{n}", "insta7"), ("shard{:04d}", "shard0007"), ("s_{n:03}", "s_007"), ("x{n:x}", "x7")],
)
def test_good_schema_formats(fmt, name):
    text = GOOD.replace('schema: "insta{n}"', f"schema: {json.dumps(fmt)}")
    assert Topology.from_text(text).schema_name(7) == name


def test_schema_must_be_a_string(tmp_path):
    text = GOOD.replace('schema: "insta{n}"', "schema: [insta]")
    check_bad(tmp_path, text, "shards.schema must be a string", line=line_of(text, "schema:"))


# ---- epoch -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "epoch,needle",
    [
        ('"2999-01-01T00:00:00Z"', "id.epoch 2999-01-01T00:00:00Z is in the future"),
        ("2999-01-01", "is in the future"),
        ('"1969-12-31T23:59:59Z"', "id.epoch 1969-12-31T23:59:59Z is before 1970-01-01"),
        ("-1", "is before 1970-01-01"),
        ('"yesterday"', "id.epoch: not an ISO-8601 timestamp: 'yesterday'"),
        ("[2011]", "id.epoch: not a timestamp"),
    ],
)
def test_bad_epoch(tmp_path, epoch, needle):
    text = GOOD.replace('epoch: "2011-01-01T00:00:00Z"', f"epoch: {epoch}")
    check_bad(tmp_path, text, needle, line=line_of(text, "epoch:"))


def test_missing_epoch(tmp_path):
    text = GOOD.replace('  epoch: "2011-01-01T00:00:00Z"\n', "")
    check_bad(tmp_path, text, "id.epoch is required", line=line_of(text, "id:"))


@pytest.mark.parametrize(
    "epoch",
    [
        "2011-01-01T00:00:00Z",
        '"2011-01-01"',
        "2011-01-01",
        "1293840000000",
        '"2011-01-01T01:00:00+01:00"',
    ],
)
def test_epoch_forms(epoch):
    assert 'epoch: "2011-01-01T00:00:00Z"' in GOOD  # the replace below must find its target
    text = GOOD.replace('epoch: "2011-01-01T00:00:00Z"', f"epoch: {epoch}")
    assert f"epoch: {epoch}\n" in text
    assert Topology.from_text(text).layout.epoch_ms == 1293840000000


# ---- layouts and bit widths ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bits,needle",
    [
        (
            "{time: 41, shard: 13, sequence: 10}",
            "bit widths must sum to 63 (the sign bit stays 0), got 41+13+10 = 64",
        ),
        ("{time: 40, shard: 12, sequence: 10}", "got 40+12+10 = 62"),
        ("{time: 41, shard: 0, sequence: 22}", "bits.shard must be a positive integer"),
        ("{time: 41, shard: 12}", "id.bits is missing sequence"),
        ("{time: 41, shard: 12, sequence: 10, worker: 0}", "unknown key 'worker' in id.bits"),
    ],
)
def test_custom_bits(tmp_path, bits, needle):
    text = CUSTOM.replace("{time: 41, shard: 12, sequence: 10}", bits)
    check_bad(tmp_path, text, needle, line=line_of(text, "bits:"))


def test_custom_needs_bits(tmp_path):
    text = CUSTOM.replace("  bits: {time: 41, shard: 12, sequence: 10}\n", "")
    check_bad(
        tmp_path, text, "id.layout custom needs id.bits", line=line_of(text, "layout: custom")
    )


def test_bits_only_for_custom(tmp_path):
    text = GOOD.replace(
        "  layout: instagram\n",
        "  layout: instagram\n  bits: {time: 41, shard: 12, sequence: 10}\n",
    )
    check_bad(tmp_path, text, "id.bits is only for layout: custom", line=line_of(text, "bits:"))


@pytest.mark.parametrize(
    "layout,needle",
    [
        ("pinterest", "got 'pinterest' (decode-only: use it with decode-id --layout)"),
        ("snowflake", "decode-only"),
        ("twitter", "id.layout must be one of instagram, custom, got 'twitter'"),
    ],
)
def test_layout_must_be_mintable(tmp_path, layout, needle):
    text = GOOD.replace("layout: instagram", f"layout: {layout}")
    check_bad(tmp_path, text, needle, line=line_of(text, "layout:"))


def test_function_flavour(tmp_path):
    text = GOOD.replace("function: plpgsql", "function: pgsql")
    check_bad(
        tmp_path,
        text,
        "id.function must be one of plpgsql, sql, got 'pgsql'",
        line=line_of(text, "function:"),
    )
    assert Topology.from_text(GOOD.replace("function: plpgsql", "function: sql")).function == "sql"


# ---- unknown keys ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "old,new,needle,marker",
    [
        (
            "version: 1\n",
            "version: 1\ncolour: blue\n",
            "unknown key 'colour' in the top level",
            "colour:",
        ),
        (
            "  function: plpgsql\n",
            "  function: plpgsql\n  colour: blue\n",
            "unknown key 'colour' in id",
            "colour:",
        ),
        (
            "  count: 2000\n",
            "  count: 2000\n  colour: blue\n",
            "unknown key 'colour' in shards",
            "colour:",
        ),
        (
            '    shards: "1000-1999"\n',
            '    shards: "1000-1999"\n    colour: blue\n',
            "unknown key 'colour' in hosts[1]",
            "colour:",
        ),
        (
            "  key: user_id\n",
            "  key: user_id\n  colour: blue\n",
            "unknown key 'colour' in routing",
            "colour:",
        ),
        (
            "routing:\n",
            "placement:\n  colour: blue\nrouting:\n",
            "unknown key 'colour' in placement",
            "colour:",
        ),
        (
            "    password_env: PG1_PASSWORD\n",
            "    pasword_env: PG1_PASSWORD\n",
            "unknown key 'pasword_env' in hosts[0]",
            "pasword_env",
        ),
    ],
)
def test_unknown_keys(tmp_path, old, new, needle, marker):
    text = GOOD.replace(old, new)
    assert text != GOOD
    err = check_bad(tmp_path, text, needle, "expected one of", line=line_of(text, marker))
    assert err.count("error:") == 1


def test_several_problems_are_all_reported(tmp_path):
    text = GOOD.replace("version: 1\n", "version: 1\ncolour: blue\n").replace(
        "count: 2000", "count: 2000\n  size: 3"
    )
    err = check_bad(tmp_path, text, "unknown key 'colour'", "unknown key 'size'")
    assert err.count("error:") == 2
    with pytest.raises(ConfigErrors) as info:
        Topology.from_text(text, path="t.yaml")
    assert len(info.value.errors) == 2
    assert "(and 1 more problem)" in str(info.value)


# ---- passwords in DSNs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://app:Hunter2Secret@127.0.0.1:1/app2",
        "host=127.0.0.1 port=1 password=Hunter2Secret",
        "host=127.0.0.1 port=1 password='Hunter2 Secret'",
        "postgresql://app@127.0.0.1:1/app2?password=Hunter2Secret",
    ],
)
@pytest.mark.parametrize("key", ["dsn", "standby"])
def test_inline_password_refused(tmp_path, dsn, key):
    if key == "dsn":
        text = GOOD.replace(
            'dsn: "host=127.0.0.1 port=1 dbname=app2 user=app"', f"dsn: {json.dumps(dsn)}"
        )
    else:
        text = GOOD.replace(
            'standby: "postgresql://app@127.0.0.1:1/standby"', f"standby: {json.dumps(dsn)}"
        )
    err = check_bad(
        tmp_path,
        text,
        f"{key} contains a literal password",
        "password_env",
        "--allow-inline-password",
        line=line_of(text, "Hunter2"),
    )
    assert "Hunter2Secret" not in err and "Hunter2 Secret" not in err
    # --allow-inline-password accepts it, and the password never reaches the output
    path = tmp_path / "shardctl.yaml"
    result = run(["--config", str(path), "--allow-inline-password", "info", "--json"])
    assert result.exit_code == 0, result.output
    assert "Hunter2" not in result.output
    json.loads(result.stdout)
    assert Topology.load(path, allow_inline_password=True)


def test_password_env_is_not_an_inline_password():
    topo = Topology.from_text(GOOD)
    assert topo.hosts[0].password_env == "PG1_PASSWORD"


def test_invalid_dsn(tmp_path):
    text = GOOD.replace('dsn: "host=127.0.0.1 port=1 dbname=app2 user=app"', 'dsn: "nonsense"')
    check_bad(
        tmp_path,
        text,
        "host pg2: dsn is not a valid libpq connection string",
        line=line_of(text, "nonsense"),
    )


# ---- YAML itself -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,needle,line",
    [
        ("version: 1\nid: [\n", "invalid YAML", None),
        ("version: 1\nid:\n  layout: instagram\n   epoch: x\n", "invalid YAML", 4),
        ("version: 1\nversion: 1\n", 'invalid YAML: duplicate key: "version"', 2),
        ("version: 1\nid:\n\tlayout: instagram\n", "invalid YAML", 3),
        ("a: *nope\n", "invalid YAML", 1),
        ("---\na: 1\n---\nb: 2\n", "invalid YAML", None),
    ],
)
def test_invalid_yaml(tmp_path, text, needle, line):
    check_bad(tmp_path, text, needle, line=line)


def test_duplicate_key_in_a_host(tmp_path):
    text = GOOD.replace('    shards: "1000-1999"\n', '    shards: "1000-1999"\n    name: pg3\n')
    check_bad(tmp_path, text, "duplicate key", '"name"', line=line_of(text, "name: pg3"))


@pytest.mark.parametrize(
    "text,needle",
    [
        ("", "must be a YAML mapping"),
        ("- pg1\n- pg2\n", "must be a YAML mapping"),
        ("just text\n", "must be a YAML mapping"),
    ],
)
def test_not_a_mapping(tmp_path, text, needle):
    check_bad(tmp_path, text, needle)


# ---- shard range syntax ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,needle",
    [
        ('"0-999,x"', "not a shard number or range: 'x'"),
        ('"999-0"', "range '999-0' runs backwards"),
        ('"0-499,,500-999"', "empty shard range"),
        ('"0..999"', "not a shard number or range: '0..999'"),
        ('"-1-999"', "not a shard number or range"),
        ("[[0, 1]]", "nested list"),
        ("[-1]", "shard numbers are not negative"),
        ("true", "expected a shard number"),
        ("{a: 1}", "expected a shard number"),
        ('""', "empty shard range"),
    ],
)
def test_bad_shard_ranges(tmp_path, spec, needle):
    text = GOOD.replace('"0-999"', spec)
    check_bad(tmp_path, text, f"host pg1: shards: {needle}", line=line_of(text, f"shards: {spec}"))


# ---- missing sections and versions ------------------------------------------------------------------------------


def _without(text: str, section: str) -> str:
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith(f"{section}:"):
            skipping = True
            continue
        if skipping and line.startswith(" "):
            continue
        skipping = False
        out.append(line)
    return "".join(out)


@pytest.mark.parametrize(
    "section,needle",
    [
        ("id", "missing section 'id'"),
        ("shards", "missing section 'shards'"),
        ("hosts", "'hosts' must be a non-empty list of hosts"),
        ("version", "missing 'version: 1'"),
    ],
)
def test_missing_sections(tmp_path, section, needle):
    text = _without(GOOD, section)
    assert f"\n{section}:" not in text and not text.startswith(f"{section}:")
    check_bad(tmp_path, text, needle)


def test_empty_hosts_and_wrong_version(tmp_path):
    text = GOOD.replace("version: 1", "version: 2")
    check_bad(tmp_path, text, "version must be 1, got 2", line=1)
    text = _without(GOOD, "hosts") + "hosts: []\n"
    check_bad(tmp_path, text, "'hosts' must be a non-empty list", line=line_of(text, "hosts: []"))
    text = GOOD.replace("shards:\n  count: 2000", "shards: 2000\nx:\n  count: 2000")
    check_bad(tmp_path, text, "'shards' must be a mapping")


def test_optional_sections_may_be_left_out():
    text = _without(_without(_without(GOOD, "routing"), "templates"), "migrations")
    topo = Topology.from_text(text)
    assert topo.templates_dir is None and topo.migrations_dir is None and topo.routing_key is None


@pytest.mark.parametrize(
    "routing,needle",
    [
        ("{strings: sha1}", "routing.strings must be one of md5, got 'sha1'"),
        (
            "{modulus: 2001}",
            "routing.modulus must be an integer from 1 to shards.count (2000), got 2001",
        ),
        ("{modulus: 0}", "routing.modulus must be an integer"),
        ("{key: [a]}", "routing.key must be a column name"),
    ],
)
def test_bad_routing(tmp_path, routing, needle):
    text = _without(GOOD, "routing") + f"routing: {routing}\n"
    check_bad(tmp_path, text, needle, line=line_of(text, "routing:"))


def test_routing_modulus_smaller_than_count():
    topo = Topology.from_text(_without(GOOD, "routing") + "routing: {modulus: 1000}\n")
    assert topo.modulus == 1000


# ---- which file: --config, $SHARDCTL_CONFIG, ./shardctl.yaml ------------------------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    result = run(["--config", str(path), "info"])
    assert result.exit_code == 2
    assert f"topology file not found: {path}" in result.stderr
    with pytest.raises(ConfigError, match="not found"):
        Topology.load(path)


def test_unreadable_file(tmp_path):
    result = run(["--config", str(tmp_path), "info"])  # a directory
    assert result.exit_code == 2
    assert "cannot read topology file" in result.stderr


def test_default_file_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run(["info"])
    assert result.exit_code == 2 and "topology file not found: shardctl.yaml" in result.stderr
    (tmp_path / "shardctl.yaml").write_text(GOOD)
    result = run(["info", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["config"] == "shardctl.yaml"


def test_env_var_and_config_option_pick_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shardctl.yaml").write_text(
        GOOD.replace("count: 2000", "count: bad")
    )  # must not be read
    from_env = tmp_path / "env.yaml"
    from_env.write_text(GOOD)
    from_opt = tmp_path / "opt.yaml"
    from_opt.write_text(CUSTOM)

    result = run(["info", "--json"], env={"SHARDCTL_CONFIG": str(from_env)})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"] == str(from_env)
    assert json.loads(result.stdout)["layout"] == "instagram"

    result = run(
        ["--config", str(from_opt), "info", "--json"], env={"SHARDCTL_CONFIG": str(from_env)}
    )
    assert result.exit_code == 0
    assert json.loads(result.stdout)["layout"] == "custom"

    result = run(["info"], env={"SHARDCTL_CONFIG": str(tmp_path / "missing.yaml")})
    assert result.exit_code == 2 and "missing.yaml" in result.stderr

    monkeypatch.setenv("SHARDCTL_CONFIG", str(from_env))
    assert Topology.load().path == from_env  # the library honours it too


def test_bad_topology_fails_every_offline_command(tmp_path):
    path = tmp_path / "shardctl.yaml"
    path.write_text(GOOD.replace("count: 2000", "count: 9000"))
    for args in (
        ["info"],
        ["locate", "5"],
        ["decode-id", "5"],
        ["encode-id", "--ms", "1"],
        ["render"],
    ):
        result = run(["--config", str(path), *args])
        assert result.exit_code == 2, args
        assert f"{path}:7: shards.count 9000 does not fit" in result.stderr


def test_bad_topology_fixtures_are_all_rejected():
    """Every file in tests/bad_topologies/ is refused with a line number and its expected message."""
    directory = Path(__file__).resolve().parent.parent / "bad_topologies"
    files = sorted(directory.glob("*.yaml"))
    assert files
    for path in files:
        expected = path.read_text().splitlines()[0].removeprefix("# expect:").strip()
        assert expected, f"{path.name} must start with '# expect: <message>'"
        with pytest.raises(ConfigError) as info:
            Topology.load(path)
        messages = (
            info.value.all_messages() if isinstance(info.value, ConfigErrors) else [str(info.value)]
        )
        assert any(expected in m and m.startswith(f"{path}:") for m in messages), (
            path.name,
            messages,
        )
