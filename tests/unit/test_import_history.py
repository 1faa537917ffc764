"""``shardctl migrations import``: each format's shape (tmp folders), the conversion rules, and the CLI's
exit codes (0 ok, 2 bad input with one line and nothing written)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.fleet import run_cli

from shardctl.errors import BadInput
from shardctl.model.topology import Topology
from shardctl.ops.import_history import import_history
from shardctl.sql.host_migrations import load_host
from shardctl.sql.importers import read_history
from shardctl.sql.migrations import load

FUNCTION = """CREATE FUNCTION touch_updated_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;
"""


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def topo_file(tmp_path) -> Path:
    path = tmp_path / "shardctl.yaml"
    path.write_text(
        'version: 1\nid:\n  layout: instagram\n  epoch: "2026-01-01T00:00:00Z"\nshards:\n  count: 4\n'
        '  schema: "insta{n}"\nmigrations: migrations/\nhosts:\n  - name: pg1\n'
        '    dsn: "postgresql://postgres@127.0.0.1:1/x"\n    shards: "0-3"\n'
    )
    return path


def written(topo_file: Path) -> dict[str, str]:
    folder = topo_file.parent / "migrations"
    return {p.name: p.read_text() for p in sorted(folder.iterdir())} if folder.exists() else {}


def test_golang_migrate_order_down_files_and_transaction_control(tmp_path):
    src = tree(
        tmp_path / "gm",
        {
            "000002_add_email.up.sql": "ALTER TABLE users ADD COLUMN email text;\n",
            "000002_add_email.down.sql": "ALTER TABLE users DROP COLUMN email;\n",
            "000010_later.up.sql": "CREATE INDEX users_email ON users (email);\n",
            "000001_create_users.up.sql": "BEGIN;\nCREATE TABLE users (id bigint PRIMARY KEY);\nCOMMIT;\n",
            "000001_create_users.down.sql": "DROP TABLE users;\n",
            "embed.go": "package migrations\n",
        },
    )
    history = read_history("golang-migrate", src)
    assert [m.name for m in history.migrations] == [
        "000001_create_users",
        "000002_add_email",
        "000010_later",
    ]
    assert (
        "BEGIN" in history.migrations[0].up
    )  # the reader keeps text; the import takes control out
    assert history.migrations[1].notes == ["down migration 000002_add_email.down.sql dropped"]
    assert history.skipped == ["embed.go: not a golang-migrate SQL migration"]
    tree(src, {"2_dup.up.sql": "SELECT 1;\n"})
    with pytest.raises(BadInput, match="version 2 is used twice"):
        read_history("golang-migrate", src)


def test_goose_sections_statement_blocks_and_no_transaction(tmp_path):
    src = tree(
        tmp_path / "goose",
        {
            "00001_users.sql": "-- +goose Up\nCREATE TABLE users (id bigint PRIMARY KEY, updated_at timestamptz);\n"
            "-- +goose StatementBegin\n" + FUNCTION + "-- +goose StatementEnd\n"
            "-- +goose Down\nDROP TABLE users;\n",
            "00002_index.sql": "-- +goose NO TRANSACTION\n-- +goose Up\n"
            "CREATE INDEX CONCURRENTLY users_updated ON users (updated_at);\n"
            "-- +goose Down\nDROP INDEX users_updated;\n",
        },
    )
    history = read_history("goose", src)
    first, second = history.migrations
    assert (
        "DROP TABLE" not in first.up
        and "StatementBegin" not in first.up
        and "touch_updated_at" in first.up
    )
    assert not second.transactional and "-- +goose Down section dropped" in second.notes
    tree(src, {"00003_go.go": "package x\n"})
    with pytest.raises(BadInput, match="Go migrations cannot be imported: 00003_go.go"):
        read_history("goose", src)
    (src / "00003_go.go").unlink()
    tree(src, {"00003_bad.sql": "CREATE TABLE x (id int);\n"})
    with pytest.raises(BadInput, match="no `-- \\+goose Up`"):
        read_history("goose", src)


def test_dbmate_markers_and_transaction_false(tmp_path):
    src = tree(
        tmp_path / "db",
        {
            "20240102030405_users.sql": "-- migrate:up\nCREATE TABLE users (id bigint PRIMARY KEY);\n\n"
            "-- migrate:down\nDROP TABLE users;\n",
            "20240102030406_idx.sql": "-- migrate:up transaction:false\nCREATE INDEX CONCURRENTLY u ON users (id);\n"
            "-- migrate:down\n",
        },
    )
    users, idx = read_history("dbmate", src).migrations
    assert users.up.strip() == "CREATE TABLE users (id bigint PRIMARY KEY);" and users.transactional
    assert not idx.transactional


def test_flyway_versions_repeatables_and_undo(tmp_path):
    src = tree(
        tmp_path / "fw",
        {
            "V1__init.sql": "CREATE TABLE a (id bigint PRIMARY KEY);\n",
            "V1.1__more.sql": "ALTER TABLE a ADD COLUMN b text;\n",
            "V2__next.sql": "ALTER TABLE a ADD COLUMN c text;\n",
            "V1_2__mid.sql": "ALTER TABLE a ADD COLUMN d text;\n",
            "R__views.sql": "CREATE OR REPLACE VIEW v AS SELECT 1;\n",
            "U2__next.sql": "ALTER TABLE a DROP COLUMN c;\n",
        },
    )
    history = read_history("flyway", src)
    assert [m.name for m in history.migrations] == [
        "V1__init",
        "V1.1__more",
        "V1_2__mid",
        "V2__next",
    ]
    assert any(s.startswith("R__views.sql: Flyway repeatable") for s in history.skipped)
    assert any(s.startswith("U2__next.sql") for s in history.skipped)
    tree(src, {"v3_lower.sql": "SELECT 1;\n"})
    with pytest.raises(BadInput, match="v3_lower.sql: not named as Flyway"):
        read_history("flyway", src)


def test_prisma_folders_lock_file_and_provider(tmp_path):
    src = tree(
        tmp_path / "prisma",
        {
            "migrations/migration_lock.toml": 'provider = "postgresql"\n',
            "migrations/20240101000000_init/migration.sql": '-- CreateTable\nCREATE TABLE "User" ("id" TEXT);\n',
            "migrations/20240201000000_posts/migration.sql": 'CREATE TABLE "Post" ("id" TEXT);\n',
            "schema.prisma": 'datasource db { provider = "postgresql" }\n',
        },
    )
    history = read_history("prisma", src)  # the prisma/ folder: its migrations/ is read
    assert [m.name for m in history.migrations] == ["20240101000000_init", "20240201000000_posts"]
    tree(src, {"migrations/migration_lock.toml": 'provider = "mysql"\n'})
    with pytest.raises(BadInput, match="provider 'mysql' is not PostgreSQL"):
        read_history("prisma", src / "migrations")


def test_import_converts_and_lints(tmp_path, topo_file):
    src = tree(
        tmp_path / "gm",
        {
            "1_init.up.sql": "BEGIN;\nCREATE EXTENSION IF NOT EXISTS pgcrypto;\n"
            "CREATE TABLE users (id bigint PRIMARY KEY, token text DEFAULT '{{x}}');\nCOMMIT;\n",
            "2_index.up.sql": "CREATE INDEX CONCURRENTLY users_token ON users (token);\n"
            "ALTER TABLE users ADD COLUMN age int;\n",
        },
    )
    topo = Topology.load(topo_file)
    result = import_history(topo, "golang-migrate", src)
    files = written(topo_file)
    assert list(files) == [
        "H0001__1_init_extensions.sql",
        "V0001__1_init.sql",
        "V0002__2_index.sql",
        "V0003__2_index_part2.sql",
    ]
    assert "BEGIN;" not in files["V0001__1_init.sql"] and "{% raw %}" in files["V0001__1_init.sql"]
    assert files["V0002__2_index.sql"].startswith("-- shardctl:no-transaction\n")
    assert "CREATE EXTENSION IF NOT EXISTS pgcrypto;" in files["H0001__1_init_extensions.sql"]
    # What was written is a valid shardctl folder: it loads, and the literal '{{x}}' survives rendering.
    migrations = load(topo_file.parent / "migrations")
    assert [m.transactional for m in migrations] == [True, False, True]
    assert "'{{x}}'" in migrations[0].sql(topo, 0)
    assert len(load_host(topo_file.parent / "migrations")) == 1
    assert {f.rule for f in result.findings} >= {"prefer-bigint-over-int"}
    assert any(
        line.startswith("prefer-bigint-over-int: 1 finding(s) in V0003__2_index_part2.sql")
        for line in result.must_change
    )
    # Importing again is refused: the files are there.
    with pytest.raises(BadInput, match="already holds 1_init"):
        import_history(topo, "golang-migrate", src)


def test_set_search_path_is_named_in_what_must_change(tmp_path, topo_file):
    src = tree(
        tmp_path / "fw",
        {"V1__init.sql": "SET search_path = public;\nCREATE TABLE a (id bigint PRIMARY KEY);\n"},
    )
    result = import_history(Topology.load(topo_file), "flyway", src, dry_run=True)
    assert [line.split(":")[1].strip() for line in result.must_change[:2]] == [
        "shard-search-path",
        "SET search_path in V0001__V1_init.sql",
    ], result.must_change
    assert all(line.startswith("silently wrong: ") for line in result.must_change[:2])
    assert written(topo_file) == {}


def test_cli_exit_codes_one_line_errors_and_nothing_written(tmp_path, topo_file):
    src = tree(
        tmp_path / "db",
        {"20240101_users.sql": "-- migrate:up\nCREATE TABLE users (id bigint PRIMARY KEY);\n"},
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    bad_sql = tree(tmp_path / "bad", {"20240101_x.sql": "-- migrate:up\nCREATE TABLE (;\n"})
    cases = [
        (["--from", "liquibase", str(src)], "unknown format"),
        (["--from", "dbmate", str(tmp_path / "missing")], "not a directory"),
        (["--from", "dbmate", str(empty)], "no dbmate migrations found"),
        (["--from", "dbmate", str(bad_sql)], "20240101_x: line 2 does not parse"),
    ]
    for args, message in cases:
        started = time.perf_counter()
        r = run_cli("migrations", "import", *args, config=topo_file)
        assert r.exit_code == 2 and message in r.stderr and r.stderr.strip().count("\n") == 0, (
            args,
            r,
        )
        assert time.perf_counter() - started < 2
        assert written(topo_file) == {}
    r = run_cli(
        "migrations",
        "import",
        "--from",
        "dbmate",
        str(src),
        "--dry-run",
        "--json",
        config=topo_file,
    )
    assert (
        r.exit_code == 0 and json.loads(r.stdout)["written"] is False and written(topo_file) == {}
    ), r
    r = run_cli("migrations", "import", "--from", "dbmate", str(src), "--json", config=topo_file)
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["files"][0]["to"] == "V0001__20240101_users.sql", r
    assert list(written(topo_file)) == ["V0001__20240101_users.sql"]
    # Conflicting target files: exit 2, nothing more written.
    r = run_cli("migrations", "import", "--from", "dbmate", str(src), config=topo_file)
    assert r.exit_code == 2 and "already holds" in r.stderr, r
    assert list(written(topo_file)) == ["V0001__20240101_users.sql"]


LICENCE = """-- Copyright 2024 Example Corp.
-- SPDX-License-Identifier: Apache-2.0
/* the users table */
"""


def test_a_split_file_keeps_its_comments_and_licence_header(tmp_path, topo_file):
    src = tree(
        tmp_path / "gm",
        {
            "1_users.up.sql": LICENCE + "BEGIN;\n-- who signs in\n"
            "CREATE TABLE users (id bigint PRIMARY KEY, email text);\n"
            "-- the pgcrypto for tokens\nCREATE EXTENSION IF NOT EXISTS pgcrypto;\n"
            "-- lookups by email\nCREATE INDEX CONCURRENTLY users_email ON users (email);\n"
            "COMMIT;\n-- end of file\n",
        },
    )
    import_history(Topology.load(topo_file), "golang-migrate", src)
    files = written(topo_file)
    first, second = files["V0001__1_users.sql"], files["V0002__1_users_part2.sql"]
    assert LICENCE in first and "-- who signs in\nCREATE TABLE users" in first, first
    assert "-- the pgcrypto for tokens" in second + first
    assert "-- lookups by email\nCREATE INDEX CONCURRENTLY" in second, second
    assert "-- end of file" in second and "BEGIN;" not in first + second
    assert load(topo_file.parent / "migrations")[1].sql(Topology.load(topo_file), 0)


@pytest.mark.parametrize(
    "fmt,files,table",
    [
        (
            "golang-migrate",
            {
                "1_a.up.sql": "CREATE TABLE a (id bigint PRIMARY KEY);\n"
                "ALTER TABLE schema_migrations ADD COLUMN note text;\n"
            },
            "schema_migrations",
        ),
        (
            "flyway",
            {
                "V1__a.sql": "CREATE TABLE a (id bigint PRIMARY KEY);\n"
                "UPDATE flyway_schema_history SET description = 'x' WHERE version = '1';\n"
            },
            "flyway_schema_history",
        ),
        (
            "prisma",
            {
                "20240101000000_a/migration.sql": "CREATE TABLE a (id bigint PRIMARY KEY);\n"
                "DELETE FROM \"_prisma_migrations\" WHERE migration_name = 'x';\n"
            },
            "_prisma_migrations",
        ),
    ],
)
def test_statements_on_the_tools_own_ledger_table_are_taken_out(
    tmp_path, topo_file, fmt, files, table
):
    src = tree(tmp_path / "src", files)
    result = import_history(Topology.load(topo_file), fmt, src)
    (text,) = [t for name, t in written(topo_file).items() if name.startswith("V")]
    assert table not in text.split("-- import:")[-1].split("\n", 1)[1], text
    assert f"own ledger table {table} taken out" in text
    assert any("own ledger table taken out of V0001" in line for line in result.must_change)


def test_the_ledger_table_inside_a_do_block_is_refused_by_name(tmp_path, topo_file):
    src = tree(
        tmp_path / "gm",
        {
            "1_a.up.sql": "DO $$ BEGIN ALTER TABLE schema_migrations ADD COLUMN x int; END $$;\n",
        },
    )
    with pytest.raises(
        BadInput, match="1_a: names golang-migrate's own ledger table schema_migrations"
    ):
        import_history(Topology.load(topo_file), "golang-migrate", src)
    assert written(topo_file) == {}
