"""The fast topology loader (``model/yaml_doc.py``: the document built from libyaml's events) reads
every text exactly like ruamel's round-trip loader, or leaves it to ruamel.

Each text is loaded both ways -- the fast path, and ruamel forced -- and the results must be the
same: the same document (types, values, key order, and the line of every node, key and item, which
is all ``_line_of`` reads), the same ``Topology``, or the same error messages and lines.

The corpus: every topology text the existing tests hand to the loader (recorded from a run of
``tests/unit`` and ``tests/fleet -k "topology or cli or output or info or check"`` into
``data/topology_texts.json``), ``tests/bad_topologies/``, the examples, the sandbox's own file, and
tricky scalars in every position, plus random documents.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardctl.errors import ConfigErrors
from shardctl.model import topology, yaml_doc, yaml_guard
from shardctl.model.topology import _line_of, _parse_yaml, _Validator

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).parent / "data" / "topology_texts.json"

BASE = """\
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
    shards: "0-7"
  - name: pg2
    dsn: host=127.0.0.2 port=1 dbname=app
    shards: [8, 9-15]
routing:
  key: user_id
  strings: md5
lint:
  exclude: [prefer-bigint-over-int]
"""


# ---- comparing the two loads -----------------------------------------------------------------------


def parsed(text: str, fast: bool):
    """The document (or the LimitExceeded message and line) of one way of loading."""
    try:
        return "doc", _parse_yaml(text, fast)
    except yaml_guard.LimitExceeded as exc:
        return "error", (str(exc), exc.line)


def assert_same_doc(fast, slow, where: str = "doc") -> None:
    """Same types (a Mapping for a CommentedMap, a Sequence for a CommentedSeq, scalars of the very
    same type), values, key order, and lines of every node, key and item."""
    assert _line_of(fast) == _line_of(slow), where
    if isinstance(slow, dict):
        assert isinstance(fast, dict), where
        assert [(type(k), k) for k in fast] == [(type(k), k) for k in slow], where
        for k in slow:
            assert _line_of(fast, k) == _line_of(slow, k), f"{where}[{k!r}] key line"
            assert_same_doc(fast[k], slow[k], f"{where}[{k!r}]")
    elif isinstance(slow, list):
        assert isinstance(fast, list) and len(fast) == len(slow), where
        for i, item in enumerate(slow):
            assert _line_of(fast, i) == _line_of(slow, i), f"{where}[{i}] item line"
            assert_same_doc(fast[i], item, f"{where}[{i}]")
    else:
        # repr: two ruamel loads give objects without __eq__ (TaggedScalar), and nan != nan
        assert type(fast) is type(slow) and (fast == slow or repr(fast) == repr(slow)), (
            f"{where}: {fast!r} != {slow!r}"
        )


def outcome(text: str, fast: bool, path: str | None = None, allow: bool = False):
    """What the loader makes of ``text``: the Topology and its warnings, or every error message."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "topology", _Validator(
                text, Path(path) if path else None, allow, fast_yaml=fast
            ).build()
        except ConfigErrors as exc:
            return "errors", [(e.problem, e.line, e.path) for e in exc.errors]


@contextmanager
def parsed_once(text: str, loads: dict):
    """While the Validator runs: ``_parse_yaml(text, fast)`` answers with the document of that very
    call that :func:`check_both_ways` already made and compared (``loads[fast]``), instead of loading
    the text again; any other call (or a load that raised) goes to the real one."""
    real = topology._parse_yaml

    def parse(text_: str, fast: bool = True):
        kind, doc = loads.get(fast, ("", None))
        return doc if text_ == text and kind == "doc" else real(text_, fast)

    topology._parse_yaml = parse
    try:
        yield
    finally:
        topology._parse_yaml = real


def check_both_ways(text: str, path: str | None = None, validate: bool = True) -> bool:
    """Assert the fast and the ruamel load agree on ``text`` (the document, and with ``validate`` the
    Topology or errors too); True when the fast path built it."""
    return compare_loads(text, parsed(text, True), parsed(text, False), path, validate)


def compare_loads(text: str, fast, slow, path: str | None = None, validate: bool = True) -> bool:
    """:func:`check_both_ways` on the two loads of ``text`` already made."""
    assert fast[0] == slow[0], (fast, slow)
    if fast[0] == "doc":
        assert_same_doc(fast[1], slow[1])
    else:
        assert fast == slow
    if validate:
        with parsed_once(text, {True: fast, False: slow}):
            assert outcome(text, True, path) == outcome(text, False, path)
    return fast[0] == "doc" and isinstance(fast[1], (yaml_doc.Mapping, yaml_doc.Sequence))


def corpus() -> list[str]:
    texts = json.loads(CORPUS.read_text())
    files = sorted((ROOT / "tests" / "bad_topologies").glob("*.y*ml")) + sorted(
        (ROOT / "examples").rglob("*.y*ml")
    )
    return texts + [f.read_text() for f in files]


# ---- the corpus ----------------------------------------------------------------------------------


# The default suite loads every SAMPLE_STEP-th recorded text and every file both ways (~4 s); the slow
# suite (CI) loads all of them (~20 s: ruamel's load, the reference side, is most of it).
SAMPLE_STEP = 6


def check_corpus(texts: list[str]) -> None:
    built = sum(check_both_ways(text, "shardctl.yaml") for text in texts)
    # The fast path is the common one (so this test compares something), not the only one.
    assert len(texts) // 4 < built < len(texts)


def test_a_sample_of_the_topologies_the_tests_use_loads_the_same_both_ways():
    recorded = json.loads(CORPUS.read_text())
    texts = corpus()
    sample = recorded[::SAMPLE_STEP] + texts[len(recorded) :]
    assert len(recorded) > 900 and len(sample) > 150
    check_corpus(sample)


@pytest.mark.slow
def test_every_topology_the_tests_use_loads_the_same_both_ways():
    texts = corpus()
    assert len(texts) > 900
    check_corpus(texts)


# What ``shardctl sandbox up`` writes.
SANDBOX = """\
# Written by `shardctl sandbox up`: a local fleet for trying shardctl.
version: 1
id:
  layout: instagram
  epoch: "2026-01-01T00:00:00Z"
  function: plpgsql
shards:
  count: 64
  schema: "insta{n}"
migrations: migrations/
routing:
  key: user_id
  strings: md5
hosts:
  - name: pg1
    dsn: "postgresql://postgres@127.0.0.1:33533/app"
    shards: "0-31"
  - name: pg2
    dsn: "postgresql://postgres@127.0.0.1:45089/app"
    shards: "32-63"
"""


@pytest.mark.parametrize("text", [SANDBOX, BASE])
def test_a_plain_topology_takes_the_fast_path(text):
    assert check_both_ways(text)
    doc = yaml_guard.checked_document(text)
    assert isinstance(doc, yaml_doc.Mapping) and isinstance(doc["hosts"], yaml_doc.Sequence)


def test_read_only_load_does_not_import_ruamel(tmp_path):
    path = tmp_path / "shardctl.yaml"
    path.write_text(BASE)
    code = (
        "import sys; from shardctl.model.topology import Topology; Topology.load(sys.argv[1]); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ruamel'))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    # ... and a text the fast path leaves to ruamel does import it (so the check above can fail).
    path.write_text(BASE.replace("count: 16", "count: &n 16"))
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "ruamel.yaml" in proc.stdout


# ---- tricky scalars ------------------------------------------------------------------------------

# Plain scalars ruamel (YAML 1.2) reads as something other than a string or a plain int, or as an
# int it wraps: the fast path must leave every one of them to ruamel.
NOT_STRINGS = [
    "",
    "~",
    "null",
    "Null",
    "NULL",
    "true",
    "True",
    "TRUE",
    "false",
    "False",
    "FALSE",
    "<<",
    "=",
    "0",
    "00",
    "007",
    "-1",
    "+1",
    "-0",
    "1_000",
    "0x1F",
    "0x1f",
    "0o17",
    "0b101",
    "0b",
    "+0x1",
    "1.5",
    "1.",
    ".5",
    "-.5",
    "1e3",
    "1E3",
    "1e-3",
    "1.5e+3",
    "-1e3",
    ".inf",
    "-.inf",
    "+.Inf",
    ".INF",
    ".nan",
    ".NaN",
    ".NAN",
    "2026-01-01",
    "2026-01-01T00:00:00Z",
    "2026-1-1 0:00:00",
    "2026-01-01 00:00:00.5 +01:00",
    "2026-01-01t00:00:00-05",
    "123456789012345678901",
    "1_",
]
# Plain scalars that are strings in YAML 1.2 (several of them are booleans or numbers in YAML 1.1).
STRINGS = [
    "_",
    "__",
    "yes",
    "no",
    "on",
    "off",
    "y",
    "n",
    "Yes",
    "NO",
    "nul",
    "nulls",
    "truthy",
    "tru",
    "Falsey",
    "~x",
    "<",
    "<<<",
    "==",
    "x=y",
    "0-31",
    "32-63",
    "0-31,40",
    "0xg",
    "./templates",
    "../x",
    "/abs/path",
    "migrations/",
    "_1",
    "insta{n}",
    "shard{:04d}",
    "{n}x",
    "host=127.0.0.1 port=1",
    "postgresql://u@h:5432/db?sslmode=disable",
    "a b",
    "a#b",
    "ab:",
    "x'y",
    'x"y',
    "e",
    "inf",
    "nan",
    "Infinity",
    "NaN",
    "Z",
    "T",
]
INTS = ["1", "9", "16", "64", "8192", "12345678901234567890"]
# Strings to ruamel too, made only of characters a number or a timestamp may contain: the fast path
# does not try to tell them from numbers and leaves them to ruamel.
NUMBER_LIKE = [
    "1-2-3",
    "1:20",
    "190:20:30",
    "0x",
    "1.2.3",
    "1e",
    "1e+",
    "+",
    "-",
    ".",
    "..",
    "1a",
    "0-",
    "-0-1",
    "1 - 2",
    "12:30:45.5",
]

POSITIONS = [
    ("count: 16", "count: {}"),
    ('schema: "insta{n}"', "schema: {}"),
    ("key: user_id", "key: {}"),
    ('shards: "0-7"', "shards: {}"),
    ("shards: [8, 9-15]", "shards: [{}, 9-15]"),
    ("name: pg1", "name: {}"),
    ("strings: md5", "{}: md5"),
    ("exclude: [prefer-bigint-over-int]", "exclude: [{}]"),
    ("version: 1", "version: {}"),
]


@pytest.mark.parametrize("value", NOT_STRINGS + STRINGS + INTS + NUMBER_LIKE)
def test_a_plain_scalar_reads_the_same_in_every_position(value):
    for quote in ("", "'", '"'):
        if quote and quote in value:
            continue
        scalar = quote + value + quote
        alone = [BASE.replace(old, new.replace("{}", scalar), 1) for old, new in POSITIONS]
        everywhere = BASE
        for old, new in POSITIONS:
            assert old in everywhere
            everywhere = everywhere.replace(old, new.replace("{}", scalar), 1)
        # The scalar in every position of one document, each on a line of its own: when both loads
        # build that document alike, every position read the same, for one ruamel load instead of
        # nine. The Topology is built (and compared) for the plain scalar only, to keep the suite short:
        # the corpus test builds it on 900+ texts. A load that stops at a limit names one line: then
        # each position is loaded alone.
        fast, slow = parsed(everywhere, True), parsed(everywhere, False)
        if fast[0] == slow[0] == "doc":
            compare_loads(everywhere, fast, slow, validate=not quote)
        else:
            for i, text in enumerate(alone):
                check_both_ways(text, validate=i == 0 and not quote)


@pytest.mark.parametrize("value", NOT_STRINGS + NUMBER_LIKE)
def test_the_fast_path_leaves_non_strings_to_ruamel(value):
    assert yaml_doc.plain_scalar(value) is yaml_doc.NOT_BUILT


@pytest.mark.parametrize("value", STRINGS + INTS)
def test_the_fast_path_reads_strings_and_ints(value):
    expected = int(value) if value in INTS else value
    got = yaml_doc.plain_scalar(value)
    assert got == expected and type(got) is type(expected)


def test_every_plain_scalar_ruamel_resolves_is_left_to_it():
    """ruamel's YAML 1.2 resolvers only claim scalars starting with a character the fast path checks."""
    from ruamel.yaml.resolver import implicit_resolvers

    for versions, tag, _regexp, first in implicit_resolvers:
        if (1, 2) in versions:
            assert set(first) - {""} <= yaml_doc._RESOLVED_FIRST, tag


def ruamel_12_regexps() -> list[tuple[str, re.Pattern]]:
    from ruamel.yaml.resolver import implicit_resolvers

    return [
        (tag, re.compile(rx.pattern, rx.flags))
        for versions, tag, rx, _ in implicit_resolvers
        if (1, 2) in versions and not tag.endswith(":yaml")
    ]


@settings(
    derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    # one strategy per resolver, built once (a flatmap rebuilt the regex strategy at every example)
    st.one_of(
        [
            st.tuples(st.just(tag), st.from_regex(rx, fullmatch=True))
            for tag, rx in ruamel_12_regexps()
        ]
    )
)
def test_no_scalar_a_resolver_matches_is_read_as_a_string(case):
    tag, value = case
    value = value.rstrip("\n")
    if "\n" in value or not value.isascii():
        return
    got = yaml_doc.plain_scalar(value)
    if tag.endswith(":int") and re.fullmatch(r"[1-9][0-9]{0,19}", value):
        assert got == int(value)
    elif (
        got is not yaml_doc.NOT_BUILT
    ):  # read on the fast path: it must be what ruamel reads ("_" is a str)
        from ruamel.yaml import YAML

        slow = YAML(typ="rt").load(f"a: {value}\n")["a"]
        assert type(got) is type(slow) and got == slow, (tag, value, slow)


# ---- structures the fast path leaves to ruamel, or reads -------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        BASE.replace("count: 16", "count: &n 16"),  # anchor
        BASE + "extra: *n\n",  # alias (undefined: an error)
        BASE.replace("key: user_id", "key: !!str user_id"),  # tag
        BASE.replace("key: user_id", "key: ! user_id"),  # non-specific tag
        "%YAML 1.1\n---\n" + BASE,  # directive
        "%TAG !e! tag:example.com,2000:\n---\n" + BASE,  # tag directive
        BASE + "---\nversion: 1\n",  # two documents
        BASE.replace("routing:", "routing:\n  key: dup"),  # duplicate key
        BASE.replace("strings: md5", "strings: md5\n  strings: md5"),  # duplicate key, same value
        BASE.replace("count: 16", "count: 16\n  count: '16'"),  # not a duplicate: 16 and "16"
        BASE.replace("key: user_id", "key: |\n    user_id"),  # block scalar
        BASE.replace("key: user_id", "key: >-\n    user_id"),  # folded scalar
        BASE.replace("key: user_id", "key: user\n    _id"),  # multi-line plain scalar
        BASE.replace("key: user_id", 'key: "user\n    _id"'),  # multi-line quoted scalar
        BASE.replace("key: user_id", 'key: "user\\x5fid"'),  # escape
        BASE.replace("key: user_id", "key: 'it''s'"),  # quote escape
        BASE.replace("key: user_id", "key:\tuser_id"),  # tab
        BASE.replace("\n", "\r\n"),  # CRLF
        BASE.replace("pg1", "pg\u00e9"),  # non-ASCII
        "\ufeff" + BASE,  # byte order mark
        BASE.replace("routing:", "? [a, b]\n: 1\nrouting:"),  # a list as a key
        BASE.replace("routing:", "? {a: b}\n: 1\nrouting:"),  # a mapping as a key
        BASE.replace("routing:", "<<: {x: 1}\nrouting:"),  # merge key
        BASE.replace("shards: [8, 9-15]", "shards: [8, a:b]"),  # colon in a flow scalar
        BASE.replace("shards: [8, 9-15]", "shards: {a:b}"),
        BASE.replace("shards: [8, 9-15]", "shards: [8, 9-15,]"),  # trailing comma
        BASE.replace("shards: [8, 9-15]", "shards: [8, {a: b}]"),
        BASE.replace("shards: [8, 9-15]", "shards: [\n  8,\n  9-15\n]"),  # flow list over lines
        BASE.replace("key: user_id", "key: user_id # a comment"),
        BASE.replace("key: user_id", "key: user_id#not a comment"),
        BASE.replace("key: user_id", "'key': user_id"),  # quoted key
        BASE.replace("key: user_id", "? key\n  : user_id"),  # explicit key
        BASE.replace("key: user_id", "key:    user_id   "),  # spaces
        BASE.replace("id:\n", "id: \n"),
        "---\n" + BASE + "...\n",  # explicit document
        "--- {version: 1}\n",
        "",  # empty
        "# only a comment\n",
        "just a string\n",
        "- a\n- b\n",
        "[1, 2]\n",
        "a: b: c\n",  # syntax errors
        "a: [1, 2\n",
        "a:\n  - b\n  c: d\n",
        "a: 'unclosed\n",
        "key: value\n  bad indent: 1\n",
        "- a\nb: c\n",
        "{a: 1, a: 2}\n",
        "a: 1\na: 2\n",
    ],
)
def test_structures_read_the_same_both_ways(text):
    check_both_ways(text)


@pytest.mark.parametrize(
    "text",
    [
        "k" * 1100 + ": v\n",
        "a: @x\n",
        "a: `x\n",
        "a: %x\n",
        "a: [%x]\n",
        "a: x%\n",
        "- -1\n",
        "a: - b\n",
        "a: !\n",
        "a: b\n...\n",
        "a: b\n---\n",
        "--- >\n x\n",
        "a:\n- b\n- c\n",
        "a:\n  - b\n - c\n",
        "{a: [b, c], d: e}\n",
        "[a, b]: c\n",
        "? a\n? b\n",
        "a: {b}\n",
        "a: [b: c]\n",
        "a: [? b : c]\n",
        "a:\n  b: 1\n   c: 2\n",
        "a: 'b'c\n",
        'a: "b" c\n',
        "a: b # c\n# d\n",
        "a: -\n",
        "a: - \n",
        "a: ---\n",
        "--- a\n",
        "a: ?b\n",
        "a: ? b\n",
        "a: :b\n",
        "a: b:\n",
        "a: [b,c]\n",
        "a: [b ,c]\n",
        "a: {b: c,d: e}\n",
        "a: {b:c}\n",
        "a: x\n\n\n",
        "\n\na: x\n",
        "a:   \n  x\n",
        "a: |\n",
        "a: [\n]\n",
        "a: {\n}\n",
        "a: []\nb: {}\n",
        "? a\n: b\n",
        "a: b\nc\n",
        "a: 1\n 2\n",
        "'a': \"b\"\n",
        "\"a\": 'b'\n",
    ],
)
def test_yaml_corners_read_the_same_both_ways(text):
    check_both_ways(text, validate=False)


# ---- random documents ----------------------------------------------------------------------------

_tokens = st.sampled_from(
    NOT_STRINGS + STRINGS + INTS + ["hosts", "name", "dsn", "shards", "a", "b", "a b"]
)


def _scalar(draw_style: str, value: str) -> str:
    if draw_style == "plain":
        return value
    quote = "'" if draw_style == "single" else '"'
    return quote + value.replace(quote, "") + quote


scalars = st.builds(_scalar, st.sampled_from(["plain", "plain", "single", "double"]), _tokens)


def _flow(node) -> str:
    if isinstance(node, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in node.items()) + "}"
    if isinstance(node, list):
        return "[" + ", ".join(_flow(v) for v in node) + "]"
    return node


def _render(node, flow_at: int) -> str:
    """Block style down to depth ``flow_at``, flow style below."""

    def walk(n, depth, indent):
        if depth >= flow_at and isinstance(n, (dict, list)):
            return f" {_flow(n)}\n"
        if isinstance(n, dict):
            if not n:
                return " {}\n"
            return "\n" + "".join(
                f"{' ' * indent}{k}:{walk(v, depth + 1, indent + 2)}" for k, v in n.items()
            )
        if isinstance(n, list):
            if not n:
                return " []\n"
            return "\n" + "".join(f"{' ' * indent}-{walk(v, depth + 1, indent + 2)}" for v in n)
        return f" {n}\n"

    return walk(node, 0, 0).lstrip("\n") if isinstance(node, dict) else walk(node, 0, 0).lstrip()


documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(scalars, children, max_size=4)
    ),
    max_leaves=12,
).filter(lambda d: isinstance(d, (dict, list)))


@settings(
    derandomize=True, max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(documents, st.integers(min_value=0, max_value=4))
def test_random_documents_read_the_same_both_ways(doc, flow_at):
    text = _render(doc, flow_at)
    fast, slow = parsed(text, True), parsed(text, False)
    assert fast[0] == slow[0], (text, fast, slow)
    if fast[0] == "doc":
        assert_same_doc(fast[1], slow[1])
    else:
        assert fast == slow


def test_random_documents_often_take_the_fast_path():
    """The generator makes documents the fast path builds (so the test above compares something)."""
    text = _render({"hosts": ["a", {"name": "b", "shards": "0-31"}], "count": "16"}, 1)
    assert isinstance(yaml_guard.checked_document(text), yaml_doc.Mapping), text
