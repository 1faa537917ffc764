"""Acceptance: three application histories of our own (tests/data/histories), in golang-migrate's,
Prisma's and Flyway's formats, each imported, linted, applied by ``init`` (and ``migrate``, after the
fleet holds data), ending with every shard equal to a reference built by plain ``psql -f`` of the
imported files (rendered for a shard) in a fresh database, compared by this file's own catalog query,
and the data migrations done on every shard. Their extension arrives by a host-level migration (the
importer moves CREATE EXTENSION there); shard tables use it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
from support.fleet import connect, load, run_cli

HISTORIES = Path(__file__).resolve().parents[1] / "data" / "histories"
# Shards of each history's fleet, over 2 hosts: every one is checked (16 prove the same as 64 did,
# at a quarter of the per-shard work: init, migrate, and the per-shard reads below).
SHARDS = 16

# One row per object of a schema, with the schema's own name written as S (run with search_path =
# pg_catalog, so every name the catalog functions print is qualified the same way on every shard).
ITEMS = r"""
WITH s AS (SELECT oid, nspname FROM pg_namespace WHERE nspname = ANY(%(schemas)s)),
items AS (
    SELECT s.nspname, 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
           || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
           || CASE WHEN a.attgenerated <> '' THEN ' generated' ELSE '' END AS item
      FROM s JOIN pg_class c ON c.relnamespace = s.oid
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
     WHERE c.relkind IN ('r', 'p', 'v', 'm')
    UNION ALL
    SELECT s.nspname, 'constraint ' || c.relname || '.' || k.conname || ' ' || pg_get_constraintdef(k.oid)
      FROM s JOIN pg_constraint k ON k.connamespace = s.oid JOIN pg_class c ON c.oid = k.conrelid
    UNION ALL
    SELECT s.nspname, 'index ' || pg_get_indexdef(i.indexrelid)
      FROM s JOIN pg_class c ON c.relnamespace = s.oid JOIN pg_index i ON i.indrelid = c.oid
    UNION ALL
    SELECT s.nspname, 'trigger ' || pg_get_triggerdef(t.oid)
      FROM s JOIN pg_class c ON c.relnamespace = s.oid JOIN pg_trigger t ON t.tgrelid = c.oid AND NOT t.tgisinternal
    UNION ALL
    SELECT s.nspname, 'type ' || t.typname || ' ' || coalesce(
             (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                FROM pg_enum e WHERE e.enumtypid = t.oid), '')
      FROM s JOIN pg_type t ON t.typnamespace = s.oid WHERE t.typtype = 'e'
    UNION ALL
    SELECT s.nspname, 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') '
           || CASE WHEN p.proname = 'next_id' THEN '' ELSE coalesce(pg_get_function_sqlbody(p.oid), p.prosrc) END
      FROM s JOIN pg_proc p ON p.pronamespace = s.oid
    UNION ALL
    SELECT s.nspname, 'view ' || c.relname || ' ' || pg_get_viewdef(c.oid)
      FROM s JOIN pg_class c ON c.relnamespace = s.oid WHERE c.relkind = 'v'
    UNION ALL
    SELECT s.nspname, 'sequence ' || c.relname FROM s JOIN pg_class c ON c.relnamespace = s.oid WHERE c.relkind = 'S'
)
"""
DIGEST = (
    ITEMS
    + """SELECT nspname, count(*), md5(string_agg(x, E'\\n' ORDER BY x))
  FROM (SELECT nspname, replace(item, nspname || '.', 'S.') AS x FROM items) named GROUP BY nspname"""
)


def digest_of(conn, schemas: list[str]) -> dict[str, tuple[int, str]]:
    conn.execute("SET search_path = pg_catalog")
    return {r[0]: (r[1], r[2]) for r in conn.execute(DIGEST, {"schemas": schemas}).fetchall()}


def digests(topo) -> dict[str, tuple[int, str]]:
    """Per shard schema on its host: (objects, digest)."""
    out = {}
    for host in topo.hosts:
        with connect(topo, host.name, autocommit=True) as conn:
            out.update(digest_of(conn, [topo.schema_name(n) for n in host.shards]))
    return out


def psql_reference(make_fleet, topo, tmp_path: Path, shard: int = 0) -> tuple[int, str]:
    """The schema the files define, built with plain ``psql -f`` in a fresh database: the host-level
    files, the shard template and every shard migration rendered for ``shard`` (Jinja only), run with
    the search path shardctl documents (public; then the shard's schema, public). Returns this file's
    own digest of it (objects, md5), its schema name written as S like every shard's."""
    from shardctl.sql.host_migrations import host_for_topology
    from shardctl.sql.migrations import for_topology
    from shardctl.sql.render import render_shard

    schema = topo.schema_name(shard)
    tmp_path.mkdir(parents=True, exist_ok=True)
    parts = ["\\set ON_ERROR_STOP on", "SET search_path = public;"]
    for i, m in enumerate(host_for_topology(topo)):
        (tmp_path / f"h{i}.sql").write_text(m.render(topo, topo.hosts[0].name))
        parts.append(f"\\i {tmp_path / f'h{i}.sql'}")
    (tmp_path / "shard.sql").write_text(render_shard(topo, shard))
    parts += [f"\\i {tmp_path / 'shard.sql'}", f'SET search_path = "{schema}", public;']
    for m in for_topology(topo):
        (tmp_path / m.name).write_text(m.render(topo, shard))
        parts.append(f"\\i {tmp_path / m.name}")
    (tmp_path / "all.sql").write_text("\n".join(parts) + "\n")
    dsn = make_fleet.new_database(0)
    run = subprocess.run(
        ["psql", dsn, "-X", "-q", "-f", str(tmp_path / "all.sql")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    import psycopg as pg

    with pg.connect(dsn, autocommit=True) as conn:
        return digest_of(conn, [schema])[schema]


def assert_equal_to_psql_reference(make_fleet, topo, tmp_path: Path) -> None:
    """Every shard's digest is the psql-built reference's (not the majority's, not verify's code)."""
    reference = psql_reference(make_fleet, topo, tmp_path / "psql-reference")
    found = digests(topo)
    wrong = sorted(s for s, d in found.items() if d != reference)
    assert len(found) == topo.shard_count and not wrong, (
        f"{len(wrong)} shard(s) differ from the psql reference ({reference[0]} objects): {wrong[:8]}"
    )


def differences(topo, schemas: list[str]) -> list[str]:
    """The items two differing schemas do not share (for the failure message)."""
    items = {}
    for name in (schemas[0], schemas[-1]):
        host = topo.host_of(int(name.removeprefix("insta")))
        with connect(topo, host.name, autocommit=True) as conn:
            conn.execute("SET search_path = pg_catalog")
            sql = ITEMS + "SELECT replace(item, nspname || '.', 'S.') FROM items"
            items[name] = {r[0] for r in conn.execute(sql, {"schemas": [name]}).fetchall()}
    a, b = items.values()
    return sorted(a ^ b)[:6]


def fresh_fleet(make_fleet) -> Path:
    path = make_fleet(hosts=2, shards=SHARDS)
    for f in (path.parent / "migrations").iterdir():
        f.unlink()  # the history is the whole schema
    return path


def vector_available(topo) -> bool:
    with connect(topo, "pg1") as conn:
        return conn.execute(
            "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'vector')"
        ).fetchone()[0]


def import_ok(fmt: str, source: Path, path: Path) -> dict:
    r = run_cli("migrations", "import", "--from", fmt, str(source), "--json", config=path)
    assert r.exit_code == 0, r
    doc = json.loads(r.stdout)
    assert (
        doc["written"]
        and isinstance(doc["findings"], list)
        and isinstance(doc["must_change"], list)
    )
    return doc


def per_shard(topo, sql: str) -> dict[int, tuple]:
    """``sql`` run in every shard (search_path set to it): shard → first row."""
    out = {}
    for host in topo.hosts:
        with connect(topo, host.name, autocommit=True) as conn:
            for n in host.shards:
                conn.execute(f"SET search_path = {topo.schema_name(n)}, public")
                out[n] = conn.execute(sql).fetchone()
    return out


def run_sql_everywhere(topo, template: str) -> None:
    for host in topo.hosts:
        with connect(topo, host.name) as conn:
            conn.execute(
                "".join(
                    f"SET LOCAL search_path = {topo.schema_name(n)}, public;\n"
                    + template.replace("$N", str(n))
                    for n in host.shards
                )
            )
            conn.commit()


def apply_history(path: Path, fmt: str, first: Path, rest: Path, load_data) -> tuple[dict, dict]:
    """Import the first part, init, load data, import the rest, migrate; returns both import reports."""
    topo = load(path)
    if not vector_available(topo):
        pytest.skip(
            "the sandbox's PostgreSQL has no `vector` extension (pg_available_extensions), which the "
            "history's host-level migration installs"
        )
    one = import_ok(fmt, first, path)
    r = run_cli("init", config=path)
    assert r.exit_code == 0, r
    load_data(topo)
    two = import_ok(fmt, rest, path)
    assert run_cli("migrate", "--check", config=path).exit_code == 1
    r = run_cli("migrate", config=path)
    assert r.exit_code == 0, r
    r = run_cli("migrate", "--check", config=path)
    assert r.exit_code == 0, r
    return one, two


def assert_identical(topo, at_least: int) -> None:
    """Every shard has the same schema: by verify's fingerprint (the product's check), and by the test's
    own catalog digest (an independent one)."""
    r = run_cli("verify", "--json", config=topo.path)
    assert r.exit_code == 0, r
    r = run_cli("status", "--json", config=topo.path)
    assert r.exit_code == 0 and json.loads(r.stdout)["distinct_schemas"] == 1, r
    found = digests(topo)
    assert sorted(found) == sorted(topo.schema_name(n) for n in range(SHARDS))
    kinds = {v for v in found.values()}
    assert len(kinds) == 1, f"schemas differ: {differences(topo, sorted(found))}"
    ((objects, _digest),) = kinds
    assert objects >= at_least


def split_golang_migrate(tmp_path: Path, cut: int) -> tuple[Path, Path]:
    source = HISTORIES / "golang-migrate" / "photoshare"
    first, rest = tmp_path / "gm1", tmp_path / "gm2"
    first.mkdir()
    rest.mkdir()
    for f in source.iterdir():
        shutil.copy(f, first if int(f.name.split("_")[0]) <= cut else rest)
    return first, rest


def test_golang_migrate_history(make_fleet, tmp_path):
    source = HISTORIES / "golang-migrate" / "photoshare"
    assert len(list(source.glob("*.up.sql"))) >= 40
    path = fresh_fleet(make_fleet)
    first, rest = split_golang_migrate(tmp_path, 28)

    def load_data(topo) -> None:
        run_sql_everywhere(
            topo,
            """
            INSERT INTO users (id, username, email) VALUES ($N * 10 + 1, 'Ann$N', 'ann$N@x.org'),
                ($N * 10 + 2, 'admin', 'root$N@x.org'), ($N * 10 + 3, 'Cy$N', 'cy$N@x.org');
            INSERT INTO follows VALUES ($N * 10 + 1, $N * 10 + 3), ($N * 10 + 2, $N * 10 + 3);
            INSERT INTO photos (id, user_id, width, height) VALUES ($N * 10 + 5, $N * 10 + 3, 1080, 1350);
            INSERT INTO hashtags (name) VALUES ('Sunset$N');
        """,
        )

    one, two = apply_history(path, "golang-migrate", first, rest, load_data)
    migrations = path.parent / "migrations"
    assert [f["to"] for f in one["files"] if f["host_level"]] == [
        "H0001__000001_enable_extensions_extensions.sql"
    ]
    assert "V0001__000001_enable_extensions.sql" in {f["to"] for f in one["files"]}
    index = next(f for f in one["files"] if f["from"] == "000021_notifications_unread_index")
    assert not index["transactional"]
    assert (migrations / index["to"]).read_text().startswith("-- shardctl:no-transaction\n")
    assert two["files"][0]["to"] == "V0029__000029_backfill_follow_counts.sql"
    assert len(list(migrations.glob("V*.sql"))) == 43
    topo = load(path)
    assert_identical(topo, 100)
    assert_equal_to_psql_reference(make_fleet, topo, tmp_path)
    # The data migrations ran on every shard, and the triggers work on every shard.
    rows = per_shard(
        topo,
        "SELECT (SELECT follower_count FROM users WHERE username LIKE 'Cy%'), "
        "(SELECT status::text FROM users WHERE username = 'admin'), "
        "(SELECT string_agg(name, ',') FROM hashtags), "
        "(SELECT count(*) FROM photo_embeddings)",
    )
    assert {(n, r) for n, r in rows.items()} == {
        (n, (2, "suspended", f"sunset{n}", 1)) for n in range(SHARDS)
    }
    run_sql_everywhere(
        topo, "INSERT INTO likes (photo_id, user_id) SELECT id, user_id FROM photos;"
    )
    rows = per_shard(topo, "SELECT like_count, is_blocked(1, 2) FROM photos")
    assert set(rows.values()) == {(1, False)}
    # The digest sees a difference, and says what it is.
    with connect(topo, "pg2") as conn:
        conn.execute(f"ALTER TABLE insta{SHARDS - 1}.photos ADD COLUMN extra integer")
        conn.commit()
    assert len(set(digests(topo).values())) == 2
    assert differences(topo, ["insta0", f"insta{SHARDS - 1}"]) == ["column photos.extra integer"]
    r = run_cli("verify", config=topo.path)
    assert (
        r.exit_code == 1
        and f"shard {SHARDS - 1}" in r.stdout + r.stderr
        and "extra" in r.stdout + r.stderr
    ), r


def split_prisma(tmp_path: Path, cut: int) -> tuple[Path, Path]:
    source = HISTORIES / "prisma" / "shop" / "migrations"
    first, rest = tmp_path / "p1" / "migrations", tmp_path / "p2" / "migrations"
    for target in (first, rest):
        target.mkdir(parents=True)
        shutil.copy(source / "migration_lock.toml", target)
    for i, folder in enumerate(sorted(p for p in source.iterdir() if p.is_dir())):
        shutil.copytree(folder, (first if i < cut else rest) / folder.name)
    return (
        first.parent,
        rest,
    )  # the first as prisma/ (its migrations/ is read), the rest as the folder


def test_prisma_history(make_fleet, tmp_path):
    source = HISTORIES / "prisma" / "shop" / "migrations"
    assert len([p for p in source.iterdir() if p.is_dir()]) >= 40
    path = fresh_fleet(make_fleet)
    first, rest = split_prisma(tmp_path, 23)

    def load_data(topo) -> None:
        run_sql_everywhere(
            topo,
            """
            INSERT INTO "User" ("id", "email", "updatedAt") VALUES ('u$N', 'Buyer$N@Example.com', now());
            INSERT INTO "Product" ("id", "name", "slug", "priceCents", "updatedAt")
                VALUES ('p$N', 'Book $N', 'book-$N', 1250, now());
            INSERT INTO "Order" ("id", "userId", "updatedAt") VALUES ('o$N', 'u$N', now());
            INSERT INTO "OrderItem" ("id", "orderId", "productId", "quantity", "unitPriceCents")
                VALUES ('i$N', 'o$N', 'p$N', 3, 1250);
            INSERT INTO "StockMovement" ("id", "productId", "kind", "delta") VALUES ('m$N', 'p$N', 'RESTOCK', 7);
        """,
        )

    one, _two = apply_history(path, "prisma", first, rest, load_data)
    assert [f["to"] for f in one["files"] if f["host_level"]] == [
        "H0001__20240112095200_enable_vector_extensions.sql"
    ]
    assert len(list((path.parent / "migrations").glob("V*.sql"))) == 42
    topo = load(path)
    assert_identical(topo, 150)
    assert_equal_to_psql_reference(make_fleet, topo, tmp_path)
    rows = per_shard(
        topo,
        'SELECT o."totalCents", order_total(o."id"), u."email", p."stock", p."embedding"::text, '
        'p."currency"::text, p."unitPriceCents", o."number" '
        'FROM "Order" o JOIN "User" u ON u."id" = o."userId" JOIN "Product" p ON TRUE',
    )
    assert {(n, r[2]) for n, r in rows.items()} == {
        (n, f"buyer{n}@example.com") for n in range(SHARDS)
    }
    assert {r[:2] + r[3:] for r in rows.values()} == {(3750, 3750, 7, "[0,0,0,1]", "USD", 1250, 1)}
    with pytest.raises(psycopg.errors.CheckViolation), connect(topo, "pg2") as conn:
        n = SHARDS - 4  # a shard on pg2
        conn.execute(
            f'INSERT INTO insta{n}."Review" ("id", "productId", "userId", "rating") '
            f"VALUES ('r', 'p{n}', 'u{n}', 9)"
        )


def test_flyway_history(make_fleet, tmp_path):
    """A Flyway history with what real ones hold: a licence header, an extension, "public".
    qualifiers, DO blocks that look a type and a constraint up with no schema filter, CREATE INDEX
    CONCURRENTLY, and an UPDATE of Flyway's own flyway_schema_history. The import takes the ledger
    statement out and lists the two silently-wrong findings first; fixed as their hints say, the
    history runs on 8 shards over 2 hosts, each equal to the psql-built reference."""
    source = HISTORIES / "flyway" / "bookclub"
    path = make_fleet(hosts=2, shards=8)
    for f in (path.parent / "migrations").iterdir():
        f.unlink()
    topo = load(path)
    with connect(topo, "pg1") as conn:
        if not conn.execute(
            "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'citext')"
        ).fetchone()[0]:
            pytest.skip("the sandbox's PostgreSQL has no citext extension")
    doc = import_ok("flyway", source, path)
    assert [line.split(":")[1].strip() for line in doc["must_change"][:2]] == [
        "shard-fixed-schema",
        "shard-catalog-lookup-no-schema",
    ], doc["must_change"]
    assert all(line.startswith("silently wrong: ") for line in doc["must_change"][:2])
    assert not any(line.startswith("silently wrong: ") for line in doc["must_change"][2:])
    migrations = path.parent / "migrations"
    ten = (migrations / "V0010__V10_isbn_and_history_cleanup.sql").read_text()
    assert "flyway_schema_history taken out" in ten and "UPDATE" not in ten, ten
    assert (
        "Copyright 2023 The Bookclub Authors"
        in (migrations / "V0001__V1_extensions.sql").read_text()
    )
    lint = run_cli("lint", config=path)
    assert lint.exit_code == 1 and "error: lint: silently wrong: " in lint.stderr, lint

    # What the list says to change, changed as its hints say.
    fixes = {
        "V0002__V2_create_members.sql": [('"public".', "{{ schema|ident }}.")],
        "V0005__V5_reading_status.sql": [
            (
                "WHERE typname = 'reading_status'",
                "WHERE typname = 'reading_status' AND typnamespace = {{ schema|literal }}::regnamespace",
            )
        ],
        "V0006__V6_club_name_unique.sql": [
            (
                "WHERE conname = 'clubs_owner_name_key'",
                "WHERE conname = 'clubs_owner_name_key' AND connamespace = {{ schema|literal }}::regnamespace",
            )
        ],
    }
    for name, pairs in fixes.items():
        text = (migrations / name).read_text()
        for old, new in pairs:
            assert old in text, (name, old)
            text = text.replace(old, new)
        (migrations / name).write_text(text)
    findings = json.loads(run_cli("lint", "--json", config=path).stdout)["findings"]
    assert not any(f["silently_wrong"] for f in findings), findings

    r = run_cli("init", config=path)
    assert r.exit_code == 0, r
    r = run_cli("verify", "--full", config=path)
    assert r.exit_code == 0, r
    assert_equal_to_psql_reference(make_fleet, topo, tmp_path)
    run_sql_everywhere(
        topo,
        "INSERT INTO members (email, display_name) VALUES ('Ann@Example.org', 'Ann');"
        "INSERT INTO books (title, author, pages, isbn) VALUES ('Dune', 'Herbert', 412, '0441013597');",
    )
    rows = per_shard(
        topo,
        "SELECT (SELECT count(*) FROM members WHERE email = 'ANN@EXAMPLE.ORG'), "
        "to_regclass('public.members') IS NULL, (SELECT count(*) FROM club_stats)",
    )
    assert set(rows.values()) == {(1, True, 0)}, rows
