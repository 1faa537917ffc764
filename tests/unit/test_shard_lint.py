"""shardctl's own lint rules for schema-per-shard (sql/shard_lint.py), and ``shardctl lint`` with them: no database."""

from __future__ import annotations

import json

import pytest
from support.fleet import run_cli

from shardctl.sql import shard_lint as sl


def hits(sql: str, *, transactional: bool = True, schema: str = "insta3") -> list[tuple[str, int]]:
    return [(h.rule, h.line) for h in sl.check(sql, schema, transactional=transactional)]


DO_BLOCK = """-- V0003: a unique constraint, once
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = 'photos_caption_user_uniq') THEN
        ALTER TABLE insta3.photos ADD CONSTRAINT photos_caption_user_uniq UNIQUE (user_id, caption);
    END IF;
END
$$;
"""


@pytest.mark.parametrize(
    "sql,line",
    [
        (DO_BLOCK, 4),
        ("SELECT count(*) FROM pg_indexes WHERE indexname = 'photos_user_id_idx';", 1),
        (
            "SELECT 1 FROM information_schema.columns\n WHERE table_name = 'photos' AND column_name = 'note';",
            1,
        ),
        ("SELECT 1 FROM pg_catalog.pg_class c WHERE c.relname = 'photos';", 1),
        (
            (
                "CREATE FUNCTION insta3.has_note() RETURNS boolean LANGUAGE sql AS $f$\n"
                "  SELECT EXISTS (SELECT FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid\n"
                "                  WHERE c.relname = 'photos')\n$f$;"
            ),
            2,
        ),  # attrelid is a join, not a filter on a value
        (
            (
                "CREATE FUNCTION insta3.f() RETURNS void LANGUAGE plpgsql AS $f$\nBEGIN\n"
                "  PERFORM 1 FROM pg_tables WHERE tablename = 'likes';\nEND\n$f$;"
            ),
            3,
        ),
    ],
)
def test_catalog_lookup_without_schema_filter(sql, line):
    assert (sl.CATALOG, line) in hits(sql)


@pytest.mark.parametrize(
    "sql",
    [
        DO_BLOCK.replace(
            "WHERE conname", "WHERE connamespace = 'insta3'::regnamespace AND conname"
        ),
        "SELECT count(*) FROM pg_indexes WHERE schemaname = 'insta3' AND indexname = 'photos_user_id_idx';",
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'photos';",
        "SELECT 1 FROM pg_constraint WHERE conrelid = 'insta3.photos'::regclass AND conname = 'x';",
        "SELECT count(*) FROM pg_class;",  # no lookup by name
        "SELECT 1 FROM insta3.photos WHERE caption = 'relname';",
    ],
)
def test_catalog_lookup_with_a_schema_filter_passes(sql):
    assert sl.CATALOG not in {r for r, _ in hits(sql)}


@pytest.mark.parametrize(
    "sql,line",
    [
        ('SELECT * FROM "public".users;', 1),
        (
            "CREATE INDEX i ON insta3.photos (user_id);\nALTER TABLE insta0.photos ADD COLUMN x int;",
            2,
        ),
        ("CREATE TABLE insta3.t (id bigint DEFAULT public.gen_id());", 1),
        ("CREATE TABLE insta3.t (mood public.mood);", 1),
        ("SELECT nextval('public.s'::regclass);", 1),
        ("DROP TABLE public.old;", 1),
        ("DO $$ BEGIN\n  UPDATE insta0.users SET username = lower(username);\nEND $$;", 2),
        ("CREATE FUNCTION public.f() RETURNS int LANGUAGE sql AS 'SELECT 1';", 1),
        ("CREATE TYPE public.mood AS ENUM ('a');", 1),
        ("ALTER TYPE insta0.mood ADD VALUE 'b';", 1),
        ("CREATE DOMAIN public.pos AS int CHECK (VALUE > 0);", 1),
        ("GRANT EXECUTE ON FUNCTION public.f() TO app;", 1),
    ],
)
def test_fixed_schema_qualifier(sql, line):
    assert (sl.FIXED_SCHEMA, line) in hits(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE insta3.t (id bigint DEFAULT insta3.next_id(), n int, c pg_catalog.text);",
        "SELECT * FROM information_schema.tables WHERE table_schema = 'insta3' LIMIT 0;",
        "CREATE TEMP TABLE x (i int); SELECT * FROM pg_temp.x;",
        "SELECT 'public.x is just text';",
        "DROP TRIGGER photos_touch ON photos; DROP POLICY own_rows ON photos; DROP RULE r ON photos;",
        "DROP TRIGGER IF EXISTS photos_touch ON insta3.photos;",
        "CREATE FUNCTION insta3.f() RETURNS int LANGUAGE sql AS 'SELECT 1'; CREATE TYPE insta3.mood AS ENUM ('a');",
    ],
)
def test_own_and_shared_schemas_pass(sql):
    assert sl.FIXED_SCHEMA not in {r for r, _ in hits(sql)}


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE EXTENSION IF NOT EXISTS pg_trgm;",
        "CREATE ROLE reader;",
        "ALTER ROLE app SET work_mem = '1MB';",
        "DROP ROLE reader;",
        "GRANT reader TO app;",
        "REVOKE reader FROM app;",
        "ALTER SYSTEM SET work_mem = '1MB';",
        "ALTER DATABASE app SET timezone = 'UTC';",
        "CREATE TABLESPACE t LOCATION '/x';",
    ],
)
def test_database_wide_statements(sql):
    assert hits(sql) == [(sl.DATABASE_WIDE, 1)]


def test_grants_on_the_shards_own_objects_are_not_database_wide():
    assert (
        hits("GRANT SELECT ON insta3.photos TO reader; ALTER TABLE insta3.photos OWNER TO app;")
        == []
    )


@pytest.mark.parametrize(
    "sql,line",
    [
        ("SET search_path = insta3, public;", 1),
        ("SET LOCAL search_path TO insta3;", 1),
        ("SELECT 1;\nSELECT set_config('search_path', 'insta3', true);", 2),
        ("DO $$\nBEGIN\n  PERFORM set_config('search_path', 'x', true);\nEND $$;", 3),
    ],
)
def test_search_path(sql, line):
    assert (sl.SEARCH_PATH, line) in hits(sql)


def test_other_settings_pass():
    assert (
        hits("SET LOCAL statement_timeout = '5s'; SELECT set_config('work_mem', '64MB', true);")
        == []
    )


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE INDEX CONCURRENTLY i ON insta3.photos (caption);",
        "DROP INDEX CONCURRENTLY insta3.i;",
        "REINDEX INDEX CONCURRENTLY insta3.i;",
        "ALTER TABLE insta3.p DETACH PARTITION insta3.c CONCURRENTLY;",
        "DO $$ BEGIN CREATE INDEX CONCURRENTLY i ON insta3.photos (caption); END $$;",
    ],
)
def test_concurrently_in_a_transaction(sql):
    assert sl.CONCURRENTLY in {r for r, _ in hits(sql)}
    assert sl.CONCURRENTLY not in {r for r, _ in hits(sql, transactional=False)}


def test_refresh_concurrently_is_fine_in_a_transaction():
    assert hits("REFRESH MATERIALIZED VIEW CONCURRENTLY insta3.v;") == []


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE SEQUENCE insta3.photo_seq;",
        "CREATE TABLE insta3.t (id bigserial PRIMARY KEY);",
        "CREATE TABLE insta3.t (id serial);",
        "ALTER TABLE insta3.t ADD COLUMN n smallserial;",
        "CREATE TABLE insta3.t (id bigint GENERATED ALWAYS AS IDENTITY);",
        "ALTER TABLE insta3.t ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY;",
    ],
)
def test_sequences_that_bypass_next_id(sql):
    assert sl.SEQUENCE in {r for r, _ in hits(sql)}


def test_next_id_defaults_pass():
    assert (
        hits("CREATE TABLE insta3.t (id bigint PRIMARY KEY DEFAULT insta3.next_id(), n integer);")
        == []
    )


def test_rules_can_be_chosen_and_a_syntax_error_is_left_to_migrate():
    assert sl.check(DO_BLOCK, "insta3", rules=(sl.SEQUENCE,)) == []
    assert sl.check("SELEC 1;", "insta3") == []
    (hit,) = sl.check(DO_BLOCK, "insta3")
    assert hit.column == 34 and "schema" in hit.help


TOPOLOGY = """version: 1
id: {{layout: instagram, epoch: "2026-01-01T00:00:00Z"}}
shards: {{count: 8, schema: "insta{{n}}"}}
hosts: [{{name: a, dsn: "postgresql://x@h/db", shards: "0-7"}}]
migrations: migrations/
{extra}"""


def fleet(tmp_path, extra: str = ""):
    (tmp_path / "migrations").mkdir(parents=True)
    (tmp_path / "migrations" / "V0001__photos.sql").write_text(
        "CREATE TABLE {{ schema|ident }}.photos (id bigint PRIMARY KEY DEFAULT {{ next_id }}(), "
        "user_id bigint NOT NULL, caption text);\n"
    )
    path = tmp_path / "shardctl.yaml"
    path.write_text(TOPOLOGY.format(extra=extra))
    return path


def test_lint_cli_names_file_line_rule_and_fix(tmp_path):
    path = fleet(tmp_path)
    clean = run_cli("lint", config=path)
    assert clean.exit_code == 0, clean
    v2 = tmp_path / "migrations" / "V0002__caption_unique.sql"
    v2.write_text(DO_BLOCK.replace("insta3", "{{ schema|ident }}"))
    before = v2.read_text()
    bad = run_cli("lint", config=path)
    assert bad.exit_code == 1, bad
    errors = [ln for ln in bad.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == [
        (
            "error: lint: silently wrong: V0002__caption_unique.sql:4 shard-catalog-lookup-no-schema: lookup in "
            "pg_constraint by conname with no schema filter: on every shard it finds the first "
            "shard's object"
        )
    ], bad
    assert "V0002__caption_unique.sql:4:34 shard-catalog-lookup-no-schema" in bad.stdout
    assert "filter by the shard's schema too" in " ".join(bad.stdout.split())
    doc = json.loads(run_cli("lint", "--json", config=path).stdout)
    assert [(f["file"], f["line"], f["rule"]) for f in doc["findings"]] == [
        ("V0002__caption_unique.sql", 4, "shard-catalog-lookup-no-schema")
    ]
    assert v2.read_text() == before  # lint changes nothing

    # The topology's lint.exclude turns the rule off (squawk never sees shardctl's rule names).
    off = fleet(tmp_path / "off", "lint:\n  exclude: [shard-catalog-lookup-no-schema]\n")
    (tmp_path / "off" / "migrations" / v2.name).write_text(before)
    assert run_cli("lint", config=off).exit_code == 0


def test_lint_cli_flags_concurrently_in_a_transaction_with_its_line(tmp_path):
    path = fleet(tmp_path)
    (tmp_path / "migrations" / "V0002__idx.sql").write_text(
        "-- an index\nCREATE INDEX CONCURRENTLY IF NOT EXISTS i ON {{ schema|ident }}.photos (caption);\n"
    )
    bad = run_cli("lint", config=path)
    assert bad.exit_code == 1, bad
    assert (
        "error: lint: V0002__idx.sql:2 shard-concurrently-in-transaction: CREATE INDEX CONCURRENTLY"
        in bad.stderr
    )
    assert "-- shardctl:no-transaction" in " ".join(bad.stdout.split())


def test_lint_section_still_refuses_unknown_keys_with_their_line(tmp_path):
    path = fleet(tmp_path, "lint:\n  exclude: [shard-search-path]\n  rulez: []\n")
    bad = run_cli("lint", config=path)
    assert bad.exit_code == 2, bad
    assert "shardctl.yaml:8: unknown key 'rulez' in lint" in bad.stderr, bad


def test_drop_trigger_policy_rule_on_a_fixed_schema_is_still_flagged():
    found = hits(
        "DROP TRIGGER t ON public.photos; DROP POLICY p ON public.photos; DROP RULE r ON public.x;"
    )
    assert [r for r, _ in found] == [sl.FIXED_SCHEMA] * 3


def test_silently_wrong_findings_lead_and_are_marked(tmp_path):
    """A catalog lookup without a schema filter comes before squawk's online-DDL advice, whatever the
    file order, and is marked as leaving shards silently wrong."""
    path = fleet(tmp_path)
    (tmp_path / "migrations" / "V0002__big.sql").write_text(
        "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN n int;\n"
    )
    (tmp_path / "migrations" / "V0003__caption_unique.sql").write_text(
        DO_BLOCK.replace("insta3", "{{ schema|ident }}")
    )
    doc = json.loads(run_cli("lint", "--json", config=path).stdout)
    first, *rest = doc["findings"]
    assert (first["rule"], first["silently_wrong"]) == ("shard-catalog-lookup-no-schema", True)
    assert rest and not any(f["silently_wrong"] for f in rest), rest
    human = run_cli("lint", config=path).stdout
    assert human.lstrip().startswith("silently wrong: V0003__caption_unique.sql:4:"), human
