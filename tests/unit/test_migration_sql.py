"""Migration discovery, pglast splitting/classification, checksums and lint settings: no database."""

from __future__ import annotations

import pytest

from shardctl.errors import BadInput, ConfigErrors
from shardctl.model.topology import Topology
from shardctl.sql import lint as lintlib
from shardctl.sql import migrations as miglib

TOPOLOGY = """version: 1
id: {{layout: instagram, epoch: "2026-01-01T00:00:00Z", function: {function}}}
shards: {{count: {count}, schema: "insta{{n}}"}}
hosts: [{{name: a, dsn: "postgresql://x@h/db", shards: "0-{last}"}}]
{extra}"""


def topology(count: int = 8, function: str = "plpgsql", extra: str = "") -> Topology:
    return Topology.from_text(
        TOPOLOGY.format(count=count, last=count - 1, function=function, extra=extra)
    )


def migration(tmp_path, source: str, folder: str = "m") -> miglib.Migration:
    """The only migration of a fresh folder ``tmp_path/folder``, named V0001__x.sql."""
    directory = tmp_path / folder
    directory.mkdir()
    (directory / "V0001__x.sql").write_text(source)
    (m,) = miglib.load(directory)
    return m


@pytest.mark.parametrize(
    "sql,blocker",
    [
        ("CREATE INDEX CONCURRENTLY i ON t (x)", "CREATE INDEX CONCURRENTLY"),
        ("DROP INDEX CONCURRENTLY i", "DROP INDEX CONCURRENTLY"),
        ("REINDEX INDEX CONCURRENTLY i", "REINDEX CONCURRENTLY"),
        ("VACUUM t", "VACUUM"),
        ("ALTER TABLE p DETACH PARTITION c CONCURRENTLY", "DETACH PARTITION CONCURRENTLY"),
        ("CREATE DATABASE x", "CREATE DATABASE"),
        ("ALTER SYSTEM SET work_mem = '1MB'", "ALTER SYSTEM"),
        ("CREATE INDEX i ON t (x)", None),
        ("REINDEX TABLE t", None),
        ("ANALYZE t", None),
        ("REFRESH MATERIALIZED VIEW CONCURRENTLY v", None),  # allowed in a transaction
        ("SELECT 'CREATE INDEX CONCURRENTLY'", None),  # words inside a string are not a statement
    ],
)
def test_statements_that_cannot_run_in_a_transaction(sql, blocker):
    (st,) = miglib.parse(sql)
    assert st.no_transaction == blocker


def test_parse_splits_like_postgres_and_reports_the_line():
    text = "SELECT 'a;b';\n-- c; d\nDO $f$ BEGIN PERFORM 1; END $f$;\n/* x; /* y; */ */ SELECT 1;"
    assert miglib.split_statements(text) == [
        "SELECT 'a;b'",
        "DO $f$ BEGIN PERFORM 1; END $f$",
        "SELECT 1",
    ]
    assert miglib.split_statements("SELECT 'é'; SELECT 2") == [
        "SELECT 'é'",
        "SELECT 2",
    ]  # byte offsets
    with pytest.raises(miglib.SqlSyntaxError) as info:
        miglib.parse("SELECT 1;\n\nSELEC 2;")
    assert info.value.line == 3 and "SELEC" in info.value.message
    assert [s.transaction_control for s in miglib.parse("BEGIN; SELECT 1; COMMIT")] == [
        True,
        False,
        True,
    ]


def test_rendered_sql_is_checked_after_jinja(tmp_path):
    topo = topology()
    m = migration(
        tmp_path,
        "{% if shard_id == 2 %}CREATE INDEX CONCURRENTLY i ON {{ schema }}.t (x);"
        "{% else %}SELECT 1;{% endif %}\n",
    )
    assert m.sql(topo, 1) == "SELECT 1;\n"
    with pytest.raises(
        BadInput,
        match=r"V0001__x.sql \(rendered for shard 2\) holds CREATE INDEX CONCURRENTLY, "
        r"which cannot run inside a transaction: put `-- shardctl:no-transaction`",
    ):
        m.sql(topo, 2)
    assert m.render(topo, 2).startswith("CREATE INDEX CONCURRENTLY")  # render alone is only Jinja


def test_no_transaction_file_one_statement_and_no_transaction_control(tmp_path):
    topo = topology()
    ok = migration(
        tmp_path, "-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY i ON {{ schema }}.t (x);\n"
    )
    assert ok.sql(topo, 0).endswith("ON insta0.t (x);\n")
    two = migration(
        tmp_path,
        "-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY i ON t (x);\n"
        "CREATE INDEX CONCURRENTLY j ON t (y);\n",
        "b",
    )
    with pytest.raises(
        BadInput, match="is marked -- shardctl:no-transaction but holds 2 statements"
    ):
        two.sql(topo, 0)
    commit = migration(tmp_path, "CREATE TABLE {{ schema }}.t ();\ncommit;\n", "c")
    with pytest.raises(
        BadInput, match="holds COMMIT: shardctl runs each shard's migration in a transaction"
    ):
        commit.sql(topo, 0)
    broken = migration(tmp_path, "SELECT 1;\nCREATE TABLE {{ schema }}.t (;\n", "d")
    with pytest.raises(
        BadInput, match=r"\(rendered for shard 4\) line 2 does not parse: syntax error"
    ):
        broken.sql(topo, 4)


@pytest.mark.parametrize(
    "name,allowed",
    [
        ("V0001__a.sql", True),
        ("README.md", True),
        ("readme", True),
        (".gitkeep", True),
        ("README.txt", True),
        ("V0001__a.SQL", False),
        ("V\u0661__a.sql", False),
        ("V\uff11__a.sql", False),
        ("V1__.sql", False),
        ("V1_a.sql", False),
        ("notes.md", False),
        (".V1__a.sql", False),
        ("V1__a.sql.bak", False),
    ],
)
def test_every_file_is_a_migration_or_refused(name, allowed):
    assert (miglib.refusal(name) is None) is allowed


def test_all_refused_files_are_named_at_once(tmp_path):
    for name in ("V0001__a.sql", "V0002__b.SQL", "V\u0660\u0660\u0660\u0663__c.sql", "todo.txt"):
        (tmp_path / name).write_text("SELECT 1;\n")
    with pytest.raises(Exception) as info:
        miglib.load(tmp_path)
    message = str(info.value)
    assert (
        "V0002__b.SQL" in message
        and "V\u0660\u0660\u0660\u0663__c.sql" in message
        and "todo.txt" in message
    )


def test_checksum_counts_the_file_and_the_shard_not_fleet_wide_values(tmp_path):
    m = migration(
        tmp_path,
        "COMMENT ON SCHEMA {{ schema }} IS '{{ shard_id }} of {{ shard_count }} {{ function }}';\n",
    )
    small, big, sql_flavour = topology(8), topology(16), topology(8, function="sql")
    assert m.checksum_for(small, 3) == m.checksum_for(big, 3) == m.checksum_for(sql_flavour, 3)
    assert m.render(small, 3) != m.render(big, 3)
    assert m.checksum_for(small, 3) != m.checksum_for(small, 4)
    other_epoch = Topology.from_text(
        TOPOLOGY.format(count=8, last=7, function="plpgsql", extra="").replace(
            "2026-01-01", "2025-01-01"
        )
    )
    assert m.checksum_for(small, 3) != m.checksum_for(other_epoch, 3)
    edited = migration(tmp_path, m.source + "-- note\n", "e")
    assert edited.checksum_for(small, 3) != m.checksum_for(small, 3)
    # Rows from before: the checksum of the rendered SQL still matches.
    assert m.matches(small, 3, miglib.checksum(m.render(small, 3)))
    assert not m.matches(small, 3, "0" * 64)


def test_lint_rules_from_the_topology():
    assert lintlib.rules(topology()) == (["require-lock-timeout", "require-statement-timeout"], [])
    topo = topology(
        extra="lint:\n  exclude: [prefer-bigint-over-int]\n  include: [require-statement-timeout, "
        'ban-char-field]\n  pg_version: "16"\n'
    )
    assert lintlib.rules(topo) == (
        ["require-lock-timeout", "prefer-bigint-over-int"],
        ["require-statement-timeout", "ban-char-field"],
    )
    assert topo.lint["pg_version"] == "16"
    with pytest.raises(ConfigErrors) as info:
        topology(
            extra="lint:\n  exclude: prefer-bigint-over-int\n  pg_version: sixteen\n  rules: []\n"
        )
    text = " | ".join(info.value.all_messages())
    assert "lint.exclude must be a list of squawk rule names" in text
    assert (
        "lint.pg_version must be a PostgreSQL version" in text
        and "unknown key 'rules' in lint" in text
    )


def test_lint_with_squawk(tmp_path):
    topo = topology()
    (tmp_path / "V0001__ok.sql").write_text(
        "ALTER TABLE {{ schema }}.photos ADD COLUMN location text;\n"
    )
    (tmp_path / "V0002__index.sql").write_text(
        "SELECT 1;\nCREATE INDEX i ON {{ schema }}.photos (caption);\n"
    )
    (tmp_path / "V0003__cic.sql").write_text(
        "-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY j ON {{ schema }}.photos (caption);\n"
    )
    found = miglib.load(tmp_path)
    result = lintlib.lint(topo, found, shard=5)
    assert [(f.file, f.line, f.rule) for f in result.findings] == [
        ("V0002__index.sql", 2, "require-concurrent-index-creation"),
        (
            "V0003__cic.sql",
            2,
            "prefer-robust-stmts",
        ),  # no transaction: a failed CIC is re-run as is
    ]
    assert lintlib.lint(topo, found[:1]).ok
    relaxed = topology(
        extra="lint:\n  exclude: [require-concurrent-index-creation, prefer-robust-stmts]\n"
    )
    assert lintlib.lint(relaxed, found).ok
    strict = topology(extra="lint:\n  include: [require-lock-timeout]\n")
    assert "require-lock-timeout" in {f.rule for f in lintlib.lint(strict, found[:1]).findings}
    with pytest.raises(BadInput, match="--shard 9"):
        lintlib.lint(topo, found, shard=9)
    with pytest.raises(BadInput, match="squawk refused its arguments"):
        lintlib.lint(topology(extra="lint:\n  exclude: [no-such-rule]\n"), found)


def test_transactional_form_takes_concurrently_out():
    """What a move's preflight tries on the target for a no-transaction migration."""
    from shardctl.sql.migrations import transactional_form

    assert (
        transactional_form("CREATE INDEX CONCURRENTLY IF NOT EXISTS i ON s.t (a)")
        == "CREATE INDEX IF NOT EXISTS i ON s.t (a)"
    )
    assert transactional_form("DROP INDEX CONCURRENTLY s.i") == "DROP INDEX s.i"
    assert (
        transactional_form("REINDEX (VERBOSE, CONCURRENTLY) TABLE s.t")
        == "REINDEX (VERBOSE) TABLE s.t"
    )
    assert (
        transactional_form("ALTER TABLE s.p DETACH PARTITION s.p1 CONCURRENTLY")
        == "ALTER TABLE s.p DETACH PARTITION s.p1"
    )
    assert transactional_form("VACUUM s.t") is None
