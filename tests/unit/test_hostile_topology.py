"""Issue 15: a hostile topology file costs nothing. Alias bombs, huge files, huge values and
too many hosts or keys end with exit 2 in at most 2 s and 200 MB, one stderr line, no traceback.

The command is ``init`` against hosts at 127.0.0.1:1, where nothing listens: reaching any
host would end in exit 3, so exit 2 also shows that no host was touched. The big files are
generated here, in tmp_path.
"""

from __future__ import annotations

import time

import pytest
from support.hostile import assert_cheap, assert_refused_cheaply, run_measured

from shardctl.errors import ConfigError
from shardctl.model import yaml_guard
from shardctl.model.topology import Topology

HEAD = """\
version: 1
id:
  layout: custom
  bits: {time: 41, shard: 12, sequence: 10}
  epoch: "2020-01-01T00:00:00Z"
shards:
  count: 8
"""
HOSTS = """\
hosts:
  - name: pg1
    dsn: "postgresql://app@127.0.0.1:1/app1"
    shards: "0-3"
  - name: pg2
    dsn: "postgresql://app@127.0.0.1:1/app2"
    shards: "4-7"
"""
GOOD = HEAD + HOSTS


def bomb(indent: str, levels: int = 9) -> str:
    """A billion-laughs list: ``levels`` anchors, each a list of nine aliases of the one before."""
    lines = [f'{indent}- &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for k in range(1, levels):
        lines.append(f"{indent}- &l{k} [" + ", ".join([f"*l{k - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def write(tmp_path, text: str | bytes, name: str = "shardctl.yaml"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def refused(tmp_path, text, *needles: str) -> str:
    path = write(tmp_path, text)
    return assert_refused_cheaply(run_measured("--config", path, "init"), *needles)


def test_the_good_topology_is_accepted():
    assert [h.name for h in Topology.from_text(GOOD).hosts] == ["pg1", "pg2"]


# ---- alias bombs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["version", "routing.key", "host shards", "duplicated key"])
def test_alias_bomb_is_refused_before_it_expands(tmp_path, where):
    if where == "version":
        text = "version:\n" + bomb("  ") + GOOD.split("\n", 1)[1]
    elif where == "routing.key":
        text = GOOD + "routing:\n  key:\n" + bomb("    ")
    elif where == "host shards":
        text = GOOD.replace('    shards: "4-7"\n', "    shards:\n" + bomb("      "))
    else:
        text = "version: 1\nversion:\n" + bomb("  ") + GOOD.split("\n", 1)[1]
    assert len(text) < 2000  # a few hundred bytes that stand for 9**9 nodes
    line = refused(tmp_path, text, "YAML nodes once its aliases are expanded")
    assert line.startswith(f"error: {tmp_path / 'shardctl.yaml'}:")


def test_a_recursive_alias_is_refused(tmp_path):
    refused(tmp_path, GOOD + "routing:\n  key: &k [1, *k]\n", "refers to a node that contains it")


def test_aliases_within_the_budget_still_work():
    text = (
        HEAD
        + """\
hosts:
  - &pg1
    name: pg1
    dsn: &dsn1 "postgresql://app@127.0.0.1:1/app1"
    shards: "0-3"
  - <<: *pg1
    name: pg2
    dsn: "postgresql://app@127.0.0.1:1/app2"
    shards: "4-7"
routing:
  key: &k user_id
"""
    )
    topo = Topology.from_text(text)
    assert [(h.name, h.dsn, h.shards) for h in topo.hosts] == [
        ("pg1", "postgresql://app@127.0.0.1:1/app1", [0, 1, 2, 3]),
        ("pg2", "postgresql://app@127.0.0.1:1/app2", [4, 5, 6, 7]),
    ]
    assert topo.routing_key == "user_id"


# ---- big files ----------------------------------------------------------------------------------------------


def _big(what: str) -> bytes:
    if what == "50 MB of comments":
        return GOOD.encode() + b"# " + b"x" * 97 + b"\n" * 1 + (b"# " + b"x" * 97 + b"\n") * 500_000
    if what == "3.3M unknown keys":
        return GOOD.encode() + b"".join(b"k%d: 1\n" % i for i in range(3_300_000))
    if what == "655k hosts":
        return (HEAD + "hosts:\n").encode() + b"".join(
            b'  - {name: h%d, dsn: "dbname=d%d", shards: []}\n' % (i, i) for i in range(655_000)
        )
    if what == "50 MB DSN":
        return (
            GOOD.replace("dbname", "")
            .replace(
                '"postgresql://app@127.0.0.1:1/app2"',
                '"host=127.0.0.1 port=1 dbname=' + "d" * 50_000_000 + '"',
            )
            .encode()
        )
    raise AssertionError(what)


@pytest.mark.parametrize(
    "what",
    ["50 MB of comments"]
    + [
        pytest.param(w, marks=pytest.mark.slow)
        for w in ("3.3M unknown keys", "655k hosts", "50 MB DSN")
    ],
)
def test_a_huge_file_is_refused_by_its_size(tmp_path, what):
    data = _big(what)
    assert len(data) > 20_000_000
    refused(tmp_path, data, f"larger than {yaml_guard.MAX_BYTES // 1024} KiB")


def test_the_size_limit_is_checked_before_reading(tmp_path):
    # A device that never ends: only MAX_BYTES + 1 bytes are ever read.
    with pytest.raises(ConfigError, match="larger than 256 KiB"):
        Topology.load("/dev/zero")


# Within the size limit, the node, value and host limits apply.


def test_many_unknown_keys_within_the_size_limit(tmp_path):
    text = GOOD + "".join(f"k{i}: 1\n" for i in range(25_000))
    assert len(text) < yaml_guard.MAX_BYTES
    refused(tmp_path, text, f"more than {yaml_guard.MAX_NODES} YAML nodes")


def test_unknown_keys_make_one_problem_per_mapping(tmp_path):
    text = GOOD + "routing:\n" + "".join(f"  k{i}: 1\n" for i in range(3000))
    line = refused(
        tmp_path,
        text,
        "unknown key 'k0' in routing (expected one of: key, modulus, strings); "
        "2999 more unknown key(s) there: 'k1', 'k2', 'k3', …",
    )
    assert f"shardctl.yaml:{text.splitlines().index('  k0: 1') + 1}:" in line


def test_a_long_value_within_the_size_limit(tmp_path):
    text = GOOD.replace(
        '"postgresql://app@127.0.0.1:1/app2"',
        '"host=127.0.0.1 port=1 dbname=' + "d" * 100_000 + '"',
    )
    line = refused(tmp_path, text, "a value of 100029 characters (at most 4096)")
    assert (
        f"shardctl.yaml:{text.splitlines().index(next(x for x in text.splitlines() if 'ddd' in x)) + 1}:"
        in line
    )


def test_too_many_hosts_within_the_size_limit(tmp_path):
    text = (
        HEAD
        + "hosts:\n"
        + "".join(f'  - {{name: h{i}, dsn: "dbname=d{i}", shards: []}}\n' for i in range(1500))
    )
    assert len(text) < yaml_guard.MAX_BYTES
    refused(tmp_path, text, f"'hosts' lists more than {yaml_guard.MAX_HOSTS} hosts")


def test_deep_nesting(tmp_path):
    refused(
        tmp_path, GOOD + "routing:\n  key: " + "[" * 200 + "]" * 200 + "\n", "nests deeper than 32"
    )


def test_too_many_shards_for_shardctl(tmp_path):
    text = GOOD.replace(
        "bits: {time: 41, shard: 12, sequence: 10}", "bits: {time: 30, shard: 30, sequence: 3}"
    )
    text = text.replace("count: 8", "count: 100000000")
    refused(tmp_path, text, "shards.count 100000000 is more than shardctl handles (65536)")


def test_a_thousand_real_hosts_still_load_quickly(tmp_path):
    """The limits leave room: 1000 hosts with standbys and passwords (about 11,000 YAML nodes, the
    most a real topology needs) are accepted. This is valid input, so the 2 s bound for bad input
    does not apply: about 1 s of CPU on a quiet core, up to 2 s when the machine is overloaded."""
    text = (
        HEAD.replace("count: 8", "count: 4000")
        + "hosts:\n"
        + "".join(
            f'  - name: pg{i}\n    dsn: "postgresql://app@db{i}.internal:5432/app"\n'
            f'    standby: "postgresql://app@db{i}b.internal:5432/app"\n    password_env: PG_PASSWORD\n'
            f'    shards: "{4 * i}-{4 * i + 3}"\n'
            for i in range(1000)
        )
    )
    path = write(tmp_path, text)
    started = time.process_time()
    assert len(Topology.load(path).hosts) == 1000
    assert time.process_time() - started < 3
    result = run_measured("--config", path, "info", "--json")
    assert result.exit_code == 0, result
    assert_cheap(result, max_seconds=4)


def test_error_lines_are_short_whatever_the_value(tmp_path):
    big_list = "[" + ", ".join(["1"] * 3000) + "]"
    line = refused(
        tmp_path,
        GOOD.replace("version: 1", f"version: {big_list}"),
        "version must be 1, got a list",
    )
    assert len(line) < 200


# ---- the same server and database twice ----------------------------------------------------------------------


def test_the_same_dsn_twice_through_a_merge_key_is_refused(tmp_path):
    """The second host inherits the first one's DSN through ``<<:``: two hosts, one database."""
    text = (
        HEAD
        + """\
hosts:
  - &pg1
    name: pg1
    dsn: "postgresql://app@127.0.0.1:1/app1"
    shards: "0-3"
  - <<: *pg1
    name: pg2
    shards: "4-7"
"""
    )
    line = refused(
        tmp_path, text, "hosts pg1 and pg2 point at the same server and database (127.0.0.1:1/app1)"
    )
    assert f"shardctl.yaml:{text.splitlines().index('  - <<: *pg1') + 1}:" in line


@pytest.mark.parametrize(
    "second",
    [
        "postgresql://app@127.0.0.1:1/app1",
        "host=127.0.0.1 port=1 dbname=app1 user=other",
        "postgresql://127.0.0.1:1/app1?application_name=x",
    ],
)
def test_the_same_server_and_database_written_differently(second):
    text = GOOD.replace("postgresql://app@127.0.0.1:1/app2", second)
    with pytest.raises(
        ConfigError, match="hosts pg1 and pg2 point at the same server and database"
    ):
        Topology.from_text(text)


@pytest.mark.parametrize(
    "second",
    [
        "postgresql://app@127.0.0.1:2/app1",  # another port
        "postgresql://app@127.0.0.2:1/app1",  # another server
        "postgresql://app@127.0.0.1:1/app3",  # another database
    ],
)
def test_other_servers_or_databases_are_fine(second):
    assert (
        len(Topology.from_text(GOOD.replace("postgresql://app@127.0.0.1:1/app2", second)).hosts)
        == 2
    )


# ---- non-ASCII digits -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "old,new,needle",
    [
        ('shards: "4-7"', 'shards: "٤-٧"', "digits must be ASCII 0-9"),
        ('shards: "4-7"', 'shards: "４-７"', "digits must be ASCII 0-9"),
        ('epoch: "2020-01-01T00:00:00Z"', 'epoch: "١٥٧٧٨٣٦٨٠٠٠٠٠"', "non-ASCII digits"),
        (
            'epoch: "2020-01-01T00:00:00Z"',
            'epoch: "２０２０-01-01T00:00:00Z"',
            "only ASCII characters",
        ),
    ],
)
def test_non_ascii_digits_in_the_topology_are_refused(tmp_path, old, new, needle):
    assert old in GOOD
    refused(tmp_path, GOOD.replace(old, new), needle)


def test_non_ascii_digits_in_a_schema_format_are_refused():
    with pytest.raises(ConfigError, match="non-ASCII characters in a format spec"):
        Topology.from_text(GOOD.replace("count: 8", 'count: 8\n  schema: "shard{n:0٥}"'))


def test_too_many_hosts_through_an_alias_are_caught_by_validation():
    """A hosts list reached through an alias is not counted while parsing; validation counts it."""
    text = (
        HEAD
        + "routing:\n  key: &all\n"
        + "".join(f"    - h{i}\n" for i in range(1100))
        + "hosts: *all\n"
    )
    with pytest.raises(
        ConfigError, match="'hosts' lists 1100 hosts; shardctl handles at most 1024"
    ):
        Topology.from_text(text)


def test_comments_up_to_the_size_limit_load_quickly(tmp_path):
    """ruamel's time grows faster than linearly with comments; the size limit bounds it."""
    comment = "# " + "x" * 97 + "\n"
    text = GOOD + comment * ((yaml_guard.MAX_BYTES - len(GOOD)) // len(comment))
    assert yaml_guard.MAX_BYTES - 100 < len(text) <= yaml_guard.MAX_BYTES
    result = run_measured("--config", write(tmp_path, text), "info", "--json")
    assert result.exit_code == 0, result
    assert_cheap(result)
