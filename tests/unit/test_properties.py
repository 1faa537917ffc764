"""Property tests (hypothesis): layouts, shard ranges, the topology loader, schema names, DSN masking."""

from __future__ import annotations

import json
import re
import string
from datetime import datetime, timezone
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from shardctl.errors import BadInput, ConfigError
from shardctl.model import dsn as dsnlib
from shardctl.model.identifiers import identifier_problem, quote_ident
from shardctl.model.layouts import Layout, custom, instagram, pinterest, snowflake
from shardctl.model.ranges import format_shards, parse_shards
from shardctl.model.topology import Topology
from shardctl.sql.render import render_shard

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOW_MS = int(datetime.now(timezone.utc).timestamp() * 1000)


# The 64-bit instagram layout warns on every load; that is tested elsewhere.
pytestmark = pytest.mark.filterwarnings("ignore::shardctl.model.topology.LayoutWarning")


# ---- layouts ----------------------------------------------------------------------------------------

epochs = st.integers(min_value=0, max_value=NOW_MS)


@st.composite
def custom_layouts(draw) -> Layout:
    time = draw(st.integers(1, 61))
    shard = draw(st.integers(1, 62 - time))
    return custom(draw(epochs), time, shard, 63 - time - shard)


layouts = st.one_of(
    epochs.map(instagram),
    st.just(pinterest()),
    epochs.map(snowflake),
    custom_layouts(),
)


@st.composite
def layout_and_parts(draw):
    layout = draw(layouts)
    parts = {f.name: draw(st.integers(0, (1 << f.bits) - 1)) for f in layout.fields}
    return layout, parts


@SETTINGS
@given(layout_and_parts())
def test_encode_decode_round_trip(case):
    layout, parts = case
    value = layout.encode(**parts)
    assert 0 <= value < (1 << 64)
    if not layout.uses_sign_bit:
        assert value < (1 << 63)  # the reserved sign bit stays 0
    decoded = layout.decode(value)
    for name, part in parts.items():
        assert decoded["ms_since_epoch" if name == "time" else name] == part
    if layout.has_time:
        assert decoded["unix_ms"] == layout.epoch_ms + parts["time"]
        if decoded["time"] is not None:
            moment = datetime.strptime(decoded["time"], "%Y-%m-%dT%H:%M:%S.%f%z")
            assert round(moment.timestamp() * 1000) == decoded["unix_ms"]
    # the bigint PostgreSQL would store, decoded again, gives the same parts
    if decoded["id"] < 0:
        assert layout.uses_sign_bit
        assert decoded["id"] == value - (1 << 64)
    else:
        assert decoded["id"] == value


@st.composite
def out_of_range_parts(draw):
    layout = draw(layouts)
    parts = {f.name: draw(st.integers(0, (1 << f.bits) - 1)) for f in layout.fields}
    victim = draw(st.sampled_from(layout.fields))
    too_big = draw(st.integers(1 << victim.bits, (1 << victim.bits) + (1 << 70)))
    parts[victim.name] = draw(st.sampled_from([too_big, -draw(st.integers(1, 1 << 70))]))
    return layout, parts, victim.name


@SETTINGS
@given(out_of_range_parts())
def test_out_of_range_parts_are_bad_input(case):
    layout, parts, name = case
    with pytest.raises(BadInput, match=rf"^{name} -?\d+ does not fit in \d+ bits"):
        layout.encode(**parts)


@SETTINGS
@given(layouts, st.integers(-(1 << 66), 1 << 66))
def test_decode_any_integer_is_parts_or_bad_input(layout, value):
    try:
        decoded = layout.decode(value)
    except BadInput as exc:
        assert str(exc)
        return
    assert -(1 << 63) <= decoded["id"] < (1 << 64)
    unsigned = decoded["id"] % (1 << 64)
    again = {
        f.name: decoded["ms_since_epoch" if f.name == "time" else f.name] for f in layout.fields
    }
    assert layout.encode(**again) == unsigned


# ---- shard ranges ---------------------------------------------------------------------------------------

shard_sets = st.sets(st.integers(0, 5000), max_size=300)


@SETTINGS
@given(shard_sets)
def test_format_parse_round_trip(shards):
    text = format_shards(shards)
    if not shards:
        assert text == ""
        return
    assert re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", text)
    assert parse_shards(text) == sorted(shards)
    assert parse_shards(text, limit=max(shards) + 1) == sorted(shards)
    assert parse_shards(sorted(shards)) == sorted(shards)  # the list form
    assert parse_shards(text.split(",")) == sorted(shards)  # a list of ranges
    with pytest.raises(ValueError, match=rf"shard {max(shards)} is out of range"):
        parse_shards(text, limit=max(shards))


@SETTINGS
@given(st.one_of(st.text(max_size=30), st.text(alphabet="0123456789-, x", max_size=20)))
@example("")
@example("1-")
@example("-1")
@example("3-1")
@example("1,,2")
@example("1,1")
@example("1-3,2")
@example("１")
@example("²")
def test_parse_shards_text_is_a_list_or_value_error(text):
    try:
        shards = parse_shards(text, limit=10_000)
    except ValueError as exc:
        assert str(exc)  # a message, never a bare ValueError
        return
    assert shards == sorted(set(shards)) and all(0 <= n < 10_000 for n in shards)
    assert shards  # an accepted spec names at least one shard


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("1-", "not a shard number or range"),
        ("a", "not a shard number or range"),
        ("3-1", "runs backwards"),
        ("1,,2", "empty shard range"),
        ("1,1", "listed twice"),
        ("1-3,2", "listed twice"),
        ("", "empty"),
        ("²", "not a shard number"),
        ("1.5", "not a shard number"),
        (None, "expected a shard number"),
        ([], "empty list"),
        ([[1]], "nested list"),
        (-3, "not negative"),
        (True, "expected a shard number"),
    ],
)
def test_bad_ranges_have_messages(spec, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        parse_shards(spec)


# ---- the topology loader never crashes ------------------------------------------------------------------

GOOD = """\
version: 1
id:
  layout: instagram
  epoch: "2020-01-01T00:00:00Z"
  function: plpgsql
shards:
  count: 16
  schema: "insta{n}"
hosts:
  - name: pg1
    dsn: "postgresql://app@127.0.0.1:1/app"
    password_env: PG1_PASSWORD
    standby: "postgresql://app@127.0.0.1:1/standby"
    shards: "0-7"
  - name: pg2
    dsn: "host=127.0.0.1 port=1"
    shards: [8, "9-15"]
routing:
  key: user_id
  strings: md5
  modulus: 16
placement:
  new_objects: "0-3"
"""

yaml_scalars = st.one_of(
    st.sampled_from(
        [
            "",
            "~",
            "null",
            "true",
            "no",
            "0",
            "-1",
            "16",
            "8192",
            "9000",
            "1e3",
            "0x10",
            "0o7",
            ".inf",
            "[]",
            "{}",
            "[1, [2]]",
            "{a: 1}",
            "custom",
            "pinterest",
            "sql",
            "'0-3'",
            '"0-99999"',
            '"{n:{n.x}}"',
            '"{n:999999999}"',
            '"X{n}"',
            '"{}{}"',
            '"{n"',
            "2999-01-01",
            "1969-01-01",
            "2020-01-01",
            "!!binary aGk=",
            "!!set {a}",
            "!foo bar",
            "&a 1",
            "*a",
            "*nope",
            "|\n  text",
            ">-\n  folded",
            "{time: 41, shard: 12, sequence: 10}",
            "{time: 61, shard: 1, sequence: 1}",
            "'postgresql://u:pw@h/db'",
            "'password=x'",
            "[[0, 1]]",
            '"\\0"',
            '"\\t"',
            "? a",
            "- - -",
            "@",
            "`",
            "%",
            "'",
            '"',
            "[",
            "{",
            "}",
            "]",
            ":",
            "#",
        ]
    ),
    st.integers(-(1 << 70), 1 << 70).map(str),
    st.text(alphabet=string.ascii_letters + string.digits + " -_{}:,'\"[]!&*#%@|>\\", max_size=20),
)


@st.composite
def mutated_topologies(draw) -> str:
    lines = GOOD.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["value", "value", "delete", "insert", "indent", "key"]))
        line = lines[i]
        if action == "value" and ":" in line:
            lines[i] = line.split(":", 1)[0] + ": " + draw(yaml_scalars)
        elif action == "delete":
            del lines[i]
            if not lines:
                lines = ["x: 1"]
        elif action == "insert":
            indent = " " * draw(st.sampled_from([0, 2, 4, 6]))
            key = draw(
                st.sampled_from(
                    [
                        "colour",
                        "version",
                        "id",
                        "shards",
                        "hosts",
                        "count",
                        "name",
                        "bits",
                        "- name",
                    ]
                )
            )
            lines.insert(i, f"{indent}{key}: {draw(yaml_scalars)}")
        elif action == "indent":
            lines[i] = " " * draw(st.integers(0, 3)) + line
        else:
            lines[i] = line.replace(
                line.strip().split(":", 1)[0],
                draw(
                    st.sampled_from(
                        ["colour", "Count", "name", "shards", "epoch", "<<", "1", "? x", "- x"]
                    )
                ),
                1,
            )
    return "\n".join(lines) + "\n"


def _load_never_crashes(text: str) -> None:
    try:
        topo = Topology.from_text(text, path="prop.yaml")
    except ConfigError as exc:  # ConfigErrors is a ConfigError
        assert str(exc)
        return
    # an accepted topology is consistent
    owners = sorted(n for h in topo.hosts for n in h.shards)
    assert owners == list(range(topo.shard_count))
    assert 1 <= topo.shard_count <= topo.layout.max_shards
    for n in (0, topo.shard_count - 1):
        assert identifier_problem(topo.schema_name(n)) is None


@SETTINGS
@given(mutated_topologies())
@example(GOOD.replace("hosts:", "? x:"))  # ruamel raised TypeError (a mapping key holding a list)
@example(GOOD.replace("count: 16", "count: abc").replace('"0-7"', '"0-99999999999"'))
@example(GOOD.replace('"insta{n}"', '"x{n:{n.x}}"'))
def test_loader_mutations_raise_only_config_errors(text):
    _load_never_crashes(text)


@SETTINGS
@given(st.text(max_size=300))
def test_loader_arbitrary_text_raises_only_config_errors(text):
    _load_never_crashes(text)


json_like = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(1 << 64), 1 << 64),
        st.floats(allow_nan=False),
        st.text(max_size=15),
    ),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "version",
                    "id",
                    "shards",
                    "hosts",
                    "layout",
                    "epoch",
                    "count",
                    "schema",
                    "name",
                    "dsn",
                    "bits",
                    "time",
                    "shard",
                    "sequence",
                    "routing",
                    "modulus",
                    "x",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@SETTINGS
@given(json_like)
def test_loader_structured_garbage_raises_only_config_errors(doc):
    _load_never_crashes(json.dumps(doc))  # JSON is YAML


# ---- schema names: injection attempts are refused ----------------------------------------------------------

BAD_CHARS = "'\";$ ABCXYZ\t\n\\()-.*/é\x00"
SAFE_CHARS = string.ascii_lowercase + string.digits + "_"


def _with_schema(fmt: str) -> str:
    return GOOD.replace('schema: "insta{n}"', f"schema: {json.dumps(fmt)}")


@SETTINGS
@given(
    st.text(alphabet=SAFE_CHARS + BAD_CHARS, max_size=12),
    st.text(alphabet=SAFE_CHARS + BAD_CHARS, max_size=12),
)
@example("insta", "; DROP SCHEMA public CASCADE; --")
@example("x", "$$")
@example("Insta", "")
@example("insta", "'")
@example("insta", '"')
@example("in sta", "")
@example("insta", "\n")
def test_unsafe_schema_formats_are_refused(prefix, suffix):
    assume(any(c in BAD_CHARS for c in prefix + suffix))
    with pytest.raises(ConfigError, match="shards.schema"):
        Topology.from_text(_with_schema(prefix + "{n}" + suffix))


# Formats read back from the name itself (one plain {n} or {}), and formats looked up in a map.
READABLE_FORMATS = ["insta{n}", "shard{}", "s_{n}_x", "_{n}"]
MAPPED_FORMATS = ["shard{:04d}", "x{n:x}", "x{n!r}", "s_{n:03}", "a{n}b{n}"]


@pytest.mark.parametrize("fmt", READABLE_FORMATS + MAPPED_FORMATS)
def test_a_schema_name_reads_back_as_the_shard_that_has_it(fmt):
    topo = Topology.from_text(_with_schema(fmt))
    limit = topo.layout.max_shards
    # what a name can stand for, by brute force
    every = {topo.schema_name(n): n for n in range(limit)}
    names = set(every) | {"", "insta", "shard", "s__x", "insta٣", "insta-1", "insta+1", "insta 1"}
    for n in (0, 1, 7, 10, 99, limit - 1, limit, limit + 1, 65_535, 10**30):
        name = fmt.format(n, n=n)
        names |= {name, name + "0", name[:-1], name.upper(), "0" + name, name.replace("7", "07")}
        names |= {name.replace(str(n), "0" + str(n), 1), name.replace(str(n), "٣", 1)}
    for name in names:
        assert topo.shard_of_schema(name) == every.get(name), name


@SETTINGS
@given(st.text(alphabet=SAFE_CHARS + BAD_CHARS + "{}:!<>^=0123456789sdxn.,%#", max_size=20))
@example("{n:>5}")
@example("x{n:_>3}")
@example("x{n!r}")
@example("x{n:c}")
@example("{n:{n}}")
def test_any_accepted_schema_format_gives_safe_names(fmt):
    try:
        topo = Topology.from_text(_with_schema(fmt))
    except ConfigError:
        return
    names = [topo.schema_name(n) for n in range(topo.shard_count)]
    assert len(set(names)) == len(names)
    for name in names:
        assert re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name), name
        assert quote_ident(name) == name  # used unquoted in SQL
    sql = render_shard(topo, topo.shard_count - 1)
    assert f"CREATE SCHEMA {names[-1]};" in sql


@SETTINGS
@given(st.text(min_size=1, max_size=70))
def test_identifier_problem_agrees_with_the_rule(name):
    safe = re.fullmatch(r"[a-z_][a-z0-9_]*", name) is not None and len(name.encode()) <= 63
    if not safe:
        assert identifier_problem(name) is not None
        assert quote_ident(name).startswith('"')


# ---- DSN masking never leaks a password ---------------------------------------------------------------------

passwords = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30
)
users = st.sampled_from(["app", "", "u", "reader"])
hosts = st.sampled_from(["db1", "127.0.0.1", "db.example.com", "[::1]"])


def _kv_quote(value: str) -> str:
    if value and not any(c.isspace() or c in "'\\" for c in value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@SETTINGS
@given(
    users,
    passwords,
    hosts,
    st.sampled_from(["", ":5432"]),
    st.sampled_from(["/app", "/app?sslmode=require", ""]),
)
def test_mask_uri_password(user, password, host, port, rest):
    encoded = quote(password, safe="")
    dsn = f"postgresql://{user}:{encoded}@{host}{port}{rest}"
    masked = dsnlib.mask(dsn)
    assert masked == f"postgresql://{user}:***@{host}{port}{rest}"
    assert dsnlib.has_inline_password(dsn)
    # in a sentence, and inside JSON (--json output): still masked, and the JSON stays valid
    assert (
        dsnlib.mask(f"cannot connect to {dsn}: refused") == f"cannot connect to {masked}: refused"
    )
    doc = json.loads(dsnlib.mask(json.dumps({"dsn": dsn, "hosts": [{"dsn": dsn}]}, indent=2)))
    assert doc == {"dsn": masked, "hosts": [{"dsn": masked}]}


@SETTINGS
@given(
    passwords,
    st.sampled_from(["host=db1", "host=db1 port=5432", "dbname=app host=127.0.0.1"]),
    st.sampled_from(["", " user=app", " sslmode=require"]),
    st.sampled_from(["password", "password ", "PASSWORD"]),
)
def test_mask_key_value_password(password, before, after, keyword):
    head = f"{before} {keyword}= " if keyword.endswith(" ") else f"{before} {keyword}="
    dsn = head + _kv_quote(password) + after
    masked = dsnlib.mask(dsn)
    assert masked == head + "***" + after
    doc = json.loads(dsnlib.mask(json.dumps([dsn, {"error": f"bad dsn {dsn}"}])))
    assert doc == [masked, {"error": f"bad dsn {masked}"}]
    if keyword == "password":
        assert dsnlib.has_inline_password(dsn)


@SETTINGS
@given(passwords)
def test_mask_query_password(password):
    encoded = quote(password, safe="")
    dsn = f"postgresql://app@db1/app?sslmode=require&password={encoded}&application_name=x"
    assert (
        dsnlib.mask(dsn)
        == "postgresql://app@db1/app?sslmode=require&password=***&application_name=x"
    )


@SETTINGS
@given(st.text(alphabet=string.ascii_letters + string.digits + "!#%^*", min_size=8, max_size=20))
def test_mask_known_secrets(secret):
    dsnlib.remember_secret(secret)
    try:
        assert secret not in dsnlib.mask(f"FATAL: password authentication failed ({secret})")
        doc = dsnlib.mask(json.dumps({"error": f"x {secret} y"}))
        assert secret not in doc and json.loads(doc) == {"error": "x *** y"}
    finally:
        dsnlib._known_secrets.discard(secret)


@SETTINGS
@given(st.text(max_size=80))
def test_mask_is_idempotent_and_never_crashes(text):
    once = dsnlib.mask(text)
    assert dsnlib.mask(once) == once


# ---- numbers: ASCII digits only (issue 15) ----------------------------------------------------------------

# Decimal digits of other scripts: int() and str.isdigit() read them, shardctl must not.
foreign_digits = st.characters(categories=["Nd"]).filter(lambda c: not c.isascii())


@SETTINGS
@given(
    st.lists(
        st.one_of(foreign_digits, st.sampled_from("0123456789-,")), min_size=1, max_size=12
    ).filter(lambda chars: any(not c.isascii() for c in chars))
)
def test_non_ascii_digits_are_never_numbers(chars):
    from shardctl.ids.decode import Decoder, parse_loose
    from shardctl.ids.routing import is_integer_key, shard_for_key
    from shardctl.model.layouts import parse_epoch
    from shardctl.model.numbers import parse_int

    text = "".join(chars)
    with pytest.raises(ValueError):
        parse_shards(text)
    with pytest.raises(ValueError):
        parse_int(text, signed=True)
    assert parse_loose(text) is None and not is_integer_key(text)
    with pytest.raises(BadInput):
        Decoder(instagram(0)).parse(text)
    with pytest.raises((ValueError, BadInput)):
        parse_epoch(text)
    stripped = text.strip()
    if (stripped.removeprefix("-")).isdecimal():  # what int() would read ("--٠" is not)
        with pytest.raises(BadInput, match="non-ASCII digits"):
            shard_for_key(text, 16)


@SETTINGS
@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_ascii_numbers_still_parse(value):
    from shardctl.ids.decode import Decoder, parse_loose
    from shardctl.ids.routing import shard_for_key

    assert parse_loose(f" {value}\r") == value
    assert shard_for_key(str(value), 4096) == value % 4096
    if value < 1 << 63:
        assert Decoder(instagram(0)).parse(str(value)) == value
