"""Rendered SQL (the next_id() rules) and versioned migrations, without a database."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from shardctl.errors import BadInput, ConfigError
from shardctl.model.topology import Topology
from shardctl.sql import migrations as miglib
from shardctl.sql import render

TEMPLATE = """\
version: 1
id:
  layout: {layout}
  epoch: "2011-01-01T00:00:00Z"
  function: {function}
shards:
  count: 64
  schema: "{schema}"
hosts:
  - name: pg1
    dsn: "postgresql://app@127.0.0.1:1/app"
    shards: "0-31"
  - name: pg2
    dsn: "postgresql://app@127.0.0.1:1/app2"
    shards: "32-63"
"""
BLOG_EPOCH_MS = 1293840000000


def topology(
    function="plpgsql", layout="instagram", schema="insta{n}", path=None, extra=""
) -> Topology:
    text = TEMPLATE.format(function=function, layout=layout, schema=schema) + extra
    return Topology.from_text(text, path=path)


CUSTOM = "custom\n  bits: {time: 42, shard: 11, sequence: 10}"
FLAVOURS = [("plpgsql", "instagram"), ("sql", "instagram"), ("plpgsql", CUSTOM), ("sql", CUSTOM)]


@pytest.fixture(params=FLAVOURS, ids=["plpgsql", "sql", "custom-plpgsql", "custom-sql"])
def topo(request) -> Topology:
    function, layout = request.param
    return topology(function=function, layout=layout)


def _strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def test_next_id_rules(topo):
    layout = topo.layout
    for sql in (render.render_next_id(topo, 5), render.render_shard(topo, 5)):
        assert "%%" not in sql
        assert not re.search(r"\bnow\s*\(", sql, re.IGNORECASE), "now() is frozen per transaction"
        assert "clock_timestamp()" in _strip_comments(sql)
        assert "nextval('insta5.next_id_seq')" in sql  # schema-qualified sequence
        assert f"- {BLOG_EPOCH_MS})" in sql  # epoch baked in, in ms
        assert f"(5::bigint << {layout.shift('shard')})" in sql  # shard baked in
        assert f"<< {layout.shift('time')})" in sql
        assert f"% {layout.ids_per_ms_per_shard})" in sql
        assert "CREATE OR REPLACE FUNCTION insta5.next_id(" in sql
        assert f"LANGUAGE {topo.function} VOLATILE" in sql
    shard_sql = render.render_shard(topo, 5)
    assert re.search(r"^CREATE SEQUENCE insta5\.next_id_seq CACHE 1;$", shard_sql, re.MULTILINE)
    assert re.search(r"^CREATE SCHEMA insta5;$", shard_sql, re.MULTILINE)
    assert render.render_next_id(topo, 5) in shard_sql


def test_next_id_flavours():
    plpgsql = render.render_next_id(topology("plpgsql"), 1)
    sql = render.render_next_id(topology("sql"), 1)
    assert "LANGUAGE plpgsql" in plpgsql and "BEGIN" in plpgsql and "RETURN minted" in plpgsql
    # the plpgsql flavour keeps an ID only when the clock reads the same ms before and after nextval()
    assert _strip_comments(plpgsql).count("clock_timestamp()") == 2 and "EXIT WHEN" in plpgsql
    assert "LANGUAGE sql" in sql and "RETURNS bigint" in sql and "BEGIN" not in sql
    assert "SET " not in _strip_comments(sql)  # a SET clause would stop the planner inlining it


def _evaluate(sql: str, unix_ms: int, nextval: int) -> int:
    """Evaluate the rendered expression for a given clock and sequence value (the SQL's own constants)."""
    body = render.next_id_body(sql)
    epoch, time_shift = map(int, re.search(r"::bigint - (\d+)\) << (\d+)\)", body).groups())
    shard, shard_shift = map(int, re.search(r"\((\d+)::bigint << (\d+)\)", body).groups())
    modulus = int(re.search(r"nextval\('[a-z0-9_.]+'\) % (\d+)\)", body).group(1))
    return ((unix_ms - epoch) << time_shift) | (shard << shard_shift) | (nextval % modulus)


@pytest.mark.parametrize("shard", [0, 5, 63])
def test_next_id_computes_the_layouts_ids(topo, shard):
    sql = render.render_next_id(topo, shard)
    for ms, nextval in [
        (0, 1),
        (1387263000, 5001),
        (1387263000, 1024 * 7 + 3),
        ((1 << 40) - 1, 1023),
    ]:
        unix_ms = BLOG_EPOCH_MS + ms
        expected = topo.layout.encode(
            time=ms, shard=shard, sequence=nextval % topo.layout.ids_per_ms_per_shard
        )
        assert _evaluate(sql, unix_ms, nextval) == expected
        parts = topo.layout.decode(expected)
        assert parts["shard"] == shard and parts["unix_ms"] == unix_ms


def test_instagram_blog_example_through_the_template():
    # The blog's shard (31341 % 2000 = 1341) needs a 2000-shard topology.
    text = (
        TEMPLATE.format(function="plpgsql", layout="instagram", schema="insta{n}")
        .replace("count: 64", "count: 2000")
        .replace('"0-31"', '"0-999"')
        .replace('"32-63"', '"1000-1999"')
    )
    sql = render.render_next_id(Topology.from_text(text), 1341)
    assert _evaluate(sql, BLOG_EPOCH_MS + 1387263000, 5001) == 1387263000 << 23 | 1341 << 10 | 905


def test_next_id_body_is_what_postgres_stores(topo):
    sql = render.render_next_id(topo, 7)
    body = render.next_id_body(sql)
    assert f"$next_id${body}$next_id$" in sql
    assert "clock_timestamp()" in body and "insta7.next_id_seq" in body
    with pytest.raises(ValueError, match=r"\$next_id\$"):
        render.next_id_body("CREATE FUNCTION f() RETURNS int AS $$ SELECT 1 $$ LANGUAGE sql")


def test_render_is_deterministic(topo):
    first = [render.render_shard(topo, n) for n in range(64)]
    again = [render.render_shard(topo, n) for n in range(64)]
    assert first == again
    # and does not depend on the Topology object, only on the file
    fresh = Topology.from_text(
        TEMPLATE.format(
            function=topo.function,
            layout=CUSTOM if topo.layout.name == "custom" else "instagram",
            schema="insta{n}",
        )
    )
    assert [render.render_shard(fresh, n) for n in range(64)] == first
    assert render.render_control(topo) == render.render_control(fresh)


def test_shards_differ_only_in_number_and_schema(topo):
    a, b = render.render_shard(topo, 3), render.render_shard(topo, 4)
    assert a != b
    assert (
        a.replace("insta3", "insta4")
        .replace("shard 3 of", "shard 4 of")
        .replace("(3::bigint", "(4::bigint")
        == b
    )


def test_schema_format_reaches_every_name():
    topo = topology(schema="shard{:04d}")
    sql = render.render_shard(topo, 5)
    assert "CREATE SCHEMA shard0005;" in sql
    assert "CREATE SEQUENCE shard0005.next_id_seq CACHE 1;" in sql
    assert "nextval('shard0005.next_id_seq')" in sql and "FUNCTION shard0005.next_id(" in sql
    assert "insta" not in sql.replace("instagram", "")


def test_shard_context():
    ctx = render.shard_context(topology(), 9)
    assert ctx["schema"] == "insta9" and ctx["shard_id"] == 9 and ctx["shard_count"] == 64
    assert ctx["next_id"] == "insta9.next_id" and ctx["sequence"] == "insta9.next_id_seq"
    assert ctx["layout"]["epoch_ms"] == BLOG_EPOCH_MS and ctx["layout"]["ids_per_ms"] == 1024
    assert ctx["function"] == "plpgsql"


def test_control_schema():
    sql = render.render_control(topology())
    assert "CREATE SCHEMA IF NOT EXISTS shardctl;" in sql
    for table in ("shards", "migrations", "events", "meta"):
        assert f"CREATE TABLE IF NOT EXISTS shardctl.{table} (" in sql
    assert not re.search(r"\bnow\s*\(", sql)


def test_topology_templates_override_the_builtin_ones(tmp_path):
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "shard.sql.j2").write_text(
        "-- custom shard {{ shard_id }}\nCREATE SCHEMA {{ schema }};\n"
        "{% include 'next_id_' ~ function ~ '.sql.j2' %}"
    )
    topo = topology(path=tmp_path / "shardctl.yaml", extra="templates: tpl/\n")
    sql = render.render_shard(topo, 2)
    assert sql.startswith("-- custom shard 2\nCREATE SCHEMA insta2;\n")
    assert "CREATE OR REPLACE FUNCTION insta2.next_id(" in sql  # falls back to the built-in next_id


@pytest.mark.parametrize(
    "source,needle",
    [
        (
            "-- shard\nCREATE SCHEMA {{ shema }};\n",
            "template shard.sql.j2:2 does not render: 'shema' is undefined",
        ),
        (
            "CREATE SCHEMA {{ schema }}{{ shard_id + 'x' }};\n",
            "template shard.sql.j2:1 does not render: unsupported",
        ),
        (
            "{% include 'missing.sql.j2' %}\n",
            "template shard.sql.j2:1 does not render: 'missing.sql.j2' not found",
        ),
        ("{% if %}\n", "template shard.sql.j2:1 does not render"),
    ],
)
def test_template_errors_are_bad_input_naming_the_file(tmp_path, source, needle):
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "shard.sql.j2").write_text(source)
    topo = topology(path=tmp_path / "shardctl.yaml", extra="templates: tpl/\n")
    with pytest.raises(BadInput) as info:  # StrictUndefined: never an empty name in the SQL
        render.render_shard(topo, 2)
    assert needle in str(info.value)


# ---- migrations ---------------------------------------------------------------------------------------


def write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def test_shipped_migrations_render():
    found = miglib.load(render.builtin_dir("migrations"))
    assert [m.version for m in found] == list(range(1, len(found) + 1)) and found
    topo = topology()
    for m in found:
        sql = m.render(topo, 5)
        assert "{{" not in sql and "insta5." in sql
        assert "%%" not in sql
    first = found[0].render(topo, 5)
    assert "CREATE TABLE insta5.users" in first and "DEFAULT insta5.next_id()" in first
    assert miglib.for_topology(topo) == found  # no migrations: key means the shipped ones


def test_migration_context(tmp_path):
    directory = write(
        tmp_path / "m",
        {
            "V0001__context.sql": (
                "{{ schema }}|{{ shard_id }}|{{ shard_count }}|{{ layout.name }}|{{ layout.epoch_ms }}|{{ next_id }}|"
                '{{ schema|ident }}|{{ "it\'s"|literal }}\n'
            )
        },
    )
    (m,) = miglib.load(directory)
    assert (
        m.render(topology(), 7)
        == f"insta7|7|64|instagram|{BLOG_EPOCH_MS}|insta7.next_id|insta7|'it''s'\n"
    )
    assert (m.version, m.description, m.name) == (1, "context", "V0001__context.sql")


@pytest.mark.parametrize(
    "source,needle",
    [
        (
            "CREATE TABLE {{ shema }}.t ();\n",
            "V0002__typo.sql:1 does not render: 'shema' is undefined",
        ),
        (
            "SELECT 1;\nSELECT {{ shard_id + 'x' }};\n",
            "V0002__typo.sql:2 does not render: unsupported operand",
        ),
        (
            "SELECT 1;\n\nSELECT {{ shard_id // 0 }};\n",
            "V0002__typo.sql:3 does not render: integer division",
        ),
        ("CREATE TABLE {{ schema }}.t (id bigint DEFAULT {{ layout.next_idd }}());\n", "next_idd"),
        ("SELECT 1;\n{{ shard_id + }}\n", "V0002__typo.sql:2"),
        ("{% for x in %}\n", "is not a valid template"),
    ],
)
def test_migration_typos_are_bad_input_naming_the_file(tmp_path, source, needle):
    directory = write(tmp_path / "m", {"V0001__ok.sql": "SELECT 1;\n", "V0002__typo.sql": source})
    found = miglib.load(directory)
    assert found[0].render(topology(), 0) == "SELECT 1;\n"
    with pytest.raises(BadInput) as info:
        found[1].render(topology(), 0)
    message = str(info.value)
    assert "V0002__typo.sql" in message and needle in message


def test_migration_discovery_orders_and_allows_readme_files(tmp_path):
    # Issue 13: every file is a migration or refused by name; README-like files are allowed.
    directory = write(
        tmp_path / "m",
        {
            "V10__ten.sql": "",
            "V0002__two.sql": "",
            "V1__one.sql": "",
            "V3__three_words_here.sql": "",
            "README.md": "",
            ".gitkeep": "",
        },
    )
    for n in range(4, 10):
        (directory / f"V{n:04d}__n{n}.sql").write_text("")
    found = miglib.load(directory)
    assert [m.version for m in found] == list(range(1, 11))
    assert found[2].description == "three words here"


@pytest.mark.parametrize(
    "files,needle",
    [
        (["V0001__a.sql", "V0003__c.sql"], "without gaps: expected version 2, found V0003__c.sql"),
        (["V0002__b.sql"], "expected version 1, found V0002__b.sql"),
        (["V0000__zero.sql", "V0001__a.sql"], "expected version 1, found V0000__zero.sql"),
        (["V0001__a.sql", "V1__b.sql"], "migration version 1 is used twice"),
        (["V0001__a.sql", "V0002_b.sql"], "V0002_b.sql is not named V<version>__<description>.sql"),
        (["V0001__a.sql", "0002__b.sql"], "0002__b.sql is not named"),
        (["V0001__a.sql", "v0002__b.sql"], "v0002__b.sql is not named"),
        (["V0001__a.sql", "V0002__bad-name.sql"], "V0002__bad-name.sql is not named"),
        (["V0001__a.sql", "V0002__.sql"], "V0002__.sql is not named"),
        (["V0001__a.sql", "V0002__b c.sql"], "is not named"),
        (["V0001__a.sql", "Vx__b.sql"], "Vx__b.sql is not named"),
        (
            ["V0001__a.sql", "V0002__x.SQL"],
            (
                "V0002__x.SQL is not named V<version>__<description>.sql: the extension "
                "must be lowercase .sql"
            ),
        ),
        (["V0001__a.sql", "V0002__x.Sql"], "must be lowercase .sql, not .Sql"),
        (
            ["V0001__a.sql", "V\u0660\u0660\u0660\u0662__x.sql"],
            "the version must be written in ASCII digits 0-9",
        ),
        (["V0001__a.sql", "V0002.sql"], "two underscores must separate"),
        (["V0001__a.sql", "V0002__.sql"], "it has no description"),
        (["V0001__a.sql", "v0002__b.sql"], "must start with an uppercase V"),
        (
            ["V0001__a.sql", "notes.txt"],
            "notes.txt is not named V<version>__<description>.sql: it is not a .sql file",
        ),
        (["V0001__a.sql", ".V0002__hidden.sql"], ".V0002__hidden.sql is not named"),
        (["V0001__a.sql", "V0002__caf\u00e9.sql"], "only ASCII letters, digits and underscores"),
    ],
)
def test_migration_discovery_rejects(tmp_path, files, needle):
    directory = write(tmp_path / "m", {name: "SELECT 1;\n" for name in files})
    with pytest.raises(ConfigError) as info:
        miglib.load(directory)
    assert needle in str(info.value)


def test_migration_directory_problems(tmp_path):
    with pytest.raises(ConfigError, match="migrations directory not found"):
        miglib.load(tmp_path / "nope")
    directory = write(tmp_path / "m", {"V0001__a.sql": ""})
    (directory / "V0002__dir.sql").mkdir()
    with pytest.raises(ConfigError, match="cannot read migration V0002__dir.sql"):
        miglib.load(directory)
    (directory / "V0002__dir.sql").rmdir()
    (directory / "V0002__latin1.sql").write_bytes(b"SELECT '\xe9';\n")
    with pytest.raises(ConfigError, match="cannot read migration V0002__latin1.sql"):
        miglib.load(directory)
    assert miglib.load(write(tmp_path / "empty", {})) == []


def test_topology_migrations_dir_is_relative_to_the_file(tmp_path):
    write(tmp_path / "migs", {"V0001__only.sql": "CREATE TABLE {{ schema }}.only_one ();\n"})
    topo = topology(path=tmp_path / "shardctl.yaml", extra="migrations: migs/\n")
    (m,) = miglib.for_topology(topo)
    assert m.render(topo, 3) == "CREATE TABLE insta3.only_one ();\n"


def test_checksums(tmp_path):
    directory = write(tmp_path / "m", {"V0001__a.sql": "CREATE TABLE {{ schema }}.t ();\n"})
    (m,) = miglib.load(directory)
    topo = topology()
    sql = m.render(topo, 1)
    assert miglib.checksum(sql) == hashlib.sha256(sql.encode()).hexdigest()
    assert miglib.checksum(m.render(topo, 1)) == miglib.checksum(sql)  # stable
    assert miglib.checksum(m.render(topo, 2)) != miglib.checksum(sql)  # rendered per shard


@pytest.mark.parametrize(
    "source,transactional",
    [
        ("CREATE INDEX ON t (x);\n", True),
        ("-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY i ON t (x);\n", False),
        ("\ufeff-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY i ON t (x);\n", False),
        ("-- SHARDCTL:NO-TRANSACTION  \n", False),
        ("SELECT 1;\n-- shardctl:no-transaction\n", True),  # only on the first line
    ],
)
def test_no_transaction_directive(tmp_path, source, transactional):
    (m,) = miglib.load(write(tmp_path / "m", {"V0001__x.sql": source}))
    assert m.transactional is transactional
