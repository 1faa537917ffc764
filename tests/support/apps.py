"""The application schemas of tests/data/apps (a Django forum, a Prisma task tracker), loaded into a
database with generated data; and a snapshot of a schema (definitions and rows) to prove that a
read-only command changed nothing, or that two schemas define the same tables."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from .load import pg_bin

APPS = Path(__file__).resolve().parents[1] / "data" / "apps"
PSQL = "/usr/bin/psql"


def load_app(dsn: str, app: str, users: int = 40, *, mb: float | None = None) -> int:
    """Apply ``<app>.sql`` then ``<app>.data.sql`` (with ``users`` users) with psql, as a team would.

    ``mb``: as many users as make the app's tables (indexes and TOAST included) that many MB, from a
    sample loaded first and dropped (:func:`users_for_mb`). Returns the number of users loaded."""
    if mb is not None:
        users = users_for_mb(dsn, app, mb)
    subprocess.run(
        [PSQL, dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", f"users={users}"]
        + ["-f", str(APPS / f"{app}.sql"), "-f", str(APPS / f"{app}.data.sql")],
        check=True,
        capture_output=True,
        text=True,
    )
    return users


def table_bytes(dsn: str, schema: str = "public", tables: list[str] | None = None) -> int:
    """The size of ``schema``'s tables (all, or ``tables``), indexes and TOAST included."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
            "WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'r' "
            "AND (%s::text[] IS NULL OR c.relname = ANY(%s::text[]))",
            (schema, tables, tables),
        ).fetchone()[0]


def users_for_mb(dsn: str, app: str, mb: float, sample: int = 1000) -> int:
    """How many users make ``mb`` MB of ``app``: ``sample`` users loaded into ``dsn``'s (empty)
    ``public``, measured, then ``public`` dropped and created again. Every row of the data files
    hangs off a user, so the size grows in proportion."""
    load_app(dsn, app, sample)
    per_user = table_bytes(dsn) / sample
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    return max(10, round(mb * 2**20 / per_user))


# One line per definition of a schema's tables, with the schema's name written as S: columns (type,
# not null, default, identity), constraints, indexes, sequences, enum types. Run with search_path =
# pg_catalog, so every name is qualified the same way whatever the schema.
DEFINITIONS = r"""
WITH s AS (SELECT oid, nspname FROM pg_namespace WHERE nspname = %(schema)s),
items AS (
    SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
           || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
           || CASE a.attidentity WHEN 'a' THEN ' identity always' WHEN 'd' THEN ' identity' ELSE '' END AS item
      FROM s JOIN pg_class c ON c.relnamespace = s.oid
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
     WHERE c.relkind IN ('r', 'p') AND c.relname <> ALL(%(skip)s)
    UNION ALL
    SELECT 'constraint ' || c.relname || '.' || k.conname || ' ' || pg_get_constraintdef(k.oid)
      FROM s JOIN pg_constraint k ON k.connamespace = s.oid JOIN pg_class c ON c.oid = k.conrelid
     WHERE c.relname <> ALL(%(skip)s)
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(i.indexrelid)
      FROM s JOIN pg_class c ON c.relnamespace = s.oid JOIN pg_index i ON i.indrelid = c.oid
     WHERE c.relname <> ALL(%(skip)s)
    UNION ALL
    SELECT 'type ' || t.typname || ' ' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                                              FROM pg_enum e WHERE e.enumtypid = t.oid)
      FROM s JOIN pg_type t ON t.typnamespace = s.oid WHERE t.typtype = 'e'
)
SELECT replace(item, (SELECT quote_ident(nspname) FROM s) || '.', 'S.') FROM items ORDER BY 1
"""

TABLES = "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace AND relkind = 'r' ORDER BY 1"


def definitions(dsn: str, schema: str = "public", skip: tuple[str, ...] = ()) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = pg_catalog")
        rows = conn.execute(DEFINITIONS, {"schema": schema, "skip": list(skip)}).fetchall()
    return [r[0] for r in rows]


def snapshot(dsn: str, schema: str = "public") -> dict[str, object]:
    """Every definition, every sequence's state and every table's rows (as a digest) of ``schema``."""
    out: dict[str, object] = {"definitions": definitions(dsn, schema)}
    with psycopg.connect(dsn, autocommit=True) as conn:
        out["sequences"] = conn.execute(
            "SELECT sequencename, last_value FROM pg_sequences WHERE schemaname = %s ORDER BY 1",
            (schema,),
        ).fetchall()
        for (table,) in conn.execute(TABLES, (schema,)).fetchall():
            q = psycopg.sql.SQL(
                "SELECT count(*), md5(string_agg(t::text, '|' ORDER BY t::text)) FROM {} t"
            )
            out[table] = conn.execute(q.format(psycopg.sql.Identifier(schema, table))).fetchone()
    return out


# What each app's plan gives no SQL for, done the way its message says: the root's unique values
# move to a global table (here: the constraint is dropped).
OWN_FIXES = {
    "tasks_prisma": ["DROP INDEX users_email_key"],
    "forum_django": ["ALTER TABLE auth_user DROP CONSTRAINT auth_user_username_key"],
}
# (child, parent, child's key, parent's key, child's column, parent's column): the rows a backfill
# filled, each with its parent's key.
BACKFILLED = {
    "tasks_prisma": [
        ("tasks", "projects", "user_id", "user_id", "project_id", "id"),
        ("task_labels", "tasks", "user_id", "user_id", "task_id", "id"),
    ],
    "forum_django": [("forum_attachment", "forum_post", "user_id", "author_id", "post_id", "id")],
}


def apply_fixes(dsn: str, app: str, doc: dict) -> None:
    """Every fix the plan gives, in its order, then the app's own (OWN_FIXES)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for b in doc["blockers"]:
            for statement in b["fix"]:
                conn.execute(statement)
        for statement in OWN_FIXES[app]:
            conn.execute(statement)
        for child, parent, key, parent_key, column, ref in BACKFILLED[app]:
            wrong = conn.execute(
                psycopg.sql.SQL(
                    "SELECT count(*), count(*) FILTER (WHERE c.{} IS DISTINCT FROM p.{}) "
                    "FROM {} c JOIN {} p ON p.{} = c.{}"
                ).format(
                    *map(psycopg.sql.Identifier, (key, parent_key, child, parent, ref, column))
                )
            ).fetchone()
            assert wrong[0] > 0 and wrong[1] == 0, (child, wrong)


# A key changed by an update, in each app's own way (after apply_fixes): a project handed to another
# user (the fixed foreign keys carry the new key down to its tasks and their labels, ON UPDATE
# CASCADE), a post credited to another author with its attachments (Django's foreign keys do not
# cascade: one statement updates both, checked at its end).
KEY_CHANGES = {
    "tasks_prisma": "UPDATE projects SET user_id = 1 + user_id %% %(users)s WHERE id %% %(every)s = 0",
    "forum_django": "WITH p AS (UPDATE forum_post SET author_id = 1 + author_id %% %(users)s "
    "WHERE id %% %(every)s = 0 RETURNING id, author_id) "
    "UPDATE forum_attachment a SET user_id = p.author_id FROM p WHERE a.post_id = p.id",
}
ROOTS = {"tasks_prisma": "users", "forum_django": "auth_user"}


def change_keys(dsn: str, app: str, every: int = 50) -> None:
    """Change the shard key of every ``every``-th row of the app's key-changing table (KEY_CHANGES)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        users = conn.execute(
            psycopg.sql.SQL("SELECT max(id) FROM {}").format(psycopg.sql.Identifier(ROOTS[app]))
        ).fetchone()[0]
        conn.execute(KEY_CHANGES[app], {"users": users, "every": every})


# What the app keeps doing while it is adopted, one pgbench transaction: a new row, and a key
# changed by an update (one row of KEY_CHANGES' table, handed to a random user). :users and :rows are
# the root's and that table's largest IDs.
WRITES = {
    "tasks_prisma": """\\set u random(1, :users)
\\set r random(1, :rows)
INSERT INTO "AuditLog" ("userId", action) VALUES (:u, 'pgbench');
UPDATE projects SET user_id = :u WHERE id = :r;
""",
    "forum_django": """\\set u random(1, :users)
\\set r random(1, :rows)
INSERT INTO forum_threadview (user_id, thread_id, viewed) VALUES (:u, :r, now());
WITH p AS (UPDATE forum_post SET author_id = :u WHERE id = :r RETURNING id, author_id)
  UPDATE forum_attachment a SET user_id = p.author_id FROM p WHERE a.post_id = p.id;
""",
}
KEY_TABLES = {"tasks_prisma": "projects", "forum_django": "forum_post"}
INSERTED = {"tasks_prisma": "AuditLog", "forum_django": "forum_threadview"}  # one row a transaction


@contextlib.contextmanager
def app_writes(dsn: str, app: str, rate: float, clients: int = 2) -> Iterator[dict]:
    """``pgbench`` writing the app's WRITES into ``dsn`` at ``rate`` transactions/s until the block
    ends (nothing with ``rate`` 0); yields a dict that gets ``transactions`` (the rows the inserts
    added: pgbench's own log is cut short when it is stopped) and ``errors`` (its error lines)."""
    out: dict = {"transactions": 0, "errors": []}
    if rate <= 0:
        yield out
        return

    def count(query: str, table: str) -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            q = psycopg.sql.SQL(query).format(psycopg.sql.Identifier(table))
            return conn.execute(q).fetchone()[0]

    users, rows = (count("SELECT max(id) FROM {}", t) for t in (ROOTS[app], KEY_TABLES[app]))
    before = count("SELECT count(*) FROM {}", INSERTED[app])
    with tempfile.TemporaryDirectory(prefix="shardctl-app-writes-") as tmp:
        script = Path(tmp) / f"{app}.sql"
        script.write_text(WRITES[app])
        proc = subprocess.Popen(
            [str(pg_bin("pgbench")), "-n", "-f", str(script), "-c", str(clients), "-j", "1"]
            + ["-R", str(rate), "-T", "86400", "-D", f"users={users}", "-D", f"rows={rows}"]
            + ["-d", dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            yield out
        finally:
            proc.terminate()  # pgbench takes SIGINT as a cancel of its running query, not an end
            try:
                text, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                text, _ = proc.communicate()
        out["transactions"] = count("SELECT count(*) FROM {}", INSERTED[app]) - before
        out["errors"] = [line for line in text.splitlines() if "error" in line.lower()][:5]


def prepare(topo, dsn: str, app: str, plan_file: Path, **size) -> dict:
    """The app loaded (``users=`` or ``mb=``), its plan's fixes run and keys changed by update, then
    planned again into ``plan_file`` (no blocker left) and the baseline written into the topology's
    migrations folder: an old database ready for ``adopt copy``. Returns the plan (a dict) and
    ``users``."""
    from shardctl import adopt_baseline, adopt_plan

    users = load_app(dsn, app, **size)
    apply_fixes(dsn, app, adopt_plan(topo, dsn).to_dict())
    change_keys(dsn, app)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    plan = adopt_plan(topo, dsn, out=plan_file).raise_for_status()
    adopt_baseline(topo, dsn, plan_file)
    return plan.to_dict() | {"users": users}


def caught_up(dsn: str, timeout: float = 300) -> None:
    """Wait until every replication slot of the database at ``dsn`` has confirmed the WAL written
    before this call (the subscriptions hold every change made until then)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        deadline = time.monotonic() + timeout
        while conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE database = current_database() "
            "AND (confirmed_flush_lsn IS NULL OR confirmed_flush_lsn < %s)",
            (lsn,),
        ).fetchone()[0]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the slots did not reach {lsn} in {timeout:g}s")
            time.sleep(0.2)


# Rows and the sum of a hash of each row's text: two tables hold the same rows when both agree.
ROWS = "SELECT {}count(*), coalesce(sum(hashtextextended(t::text, 0)), 0)::numeric FROM {} t {}"


def source_rows(dsn: str, plan: dict) -> dict[tuple[str, int | None], tuple[int, int]]:
    """On the old database, computed by PostgreSQL from the key alone: for each sharded table of the
    plan and each shard (``key % shard_count``), and each global table (shard None), the rows and
    their hash sum."""
    n, out = plan["shard_count"], {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in plan["tables"]:
            table = psycopg.sql.Identifier("public", t["name"])
            if t["kind"] == "global":
                got = conn.execute(
                    psycopg.sql.SQL(ROWS).format(psycopg.sql.SQL(""), table, psycopg.sql.SQL(""))
                ).fetchone()
                out[(t["name"], None)] = (got[0], int(got[1]))
            elif t["kind"] in ("root", "column"):
                shard = psycopg.sql.SQL("({} % {})::int, ").format(
                    psycopg.sql.Identifier(t["key"]), n
                )
                group = psycopg.sql.SQL("GROUP BY 1")
                for s, count, h in conn.execute(psycopg.sql.SQL(ROWS).format(shard, table, group)):
                    out[(t["name"], s)] = (count, int(h))
    return out


def fleet_rows(topo, plan: dict) -> dict[tuple[str, int | None], tuple[int, int]]:
    """The same on the fleet: each shard's tables on its host, the global tables in ``public`` of
    the global host (shards with no rows of a table left out, as GROUP BY leaves them out)."""
    from shardctl.engine import connections as db

    out = {}
    sharded = [t["name"] for t in plan["tables"] if t["kind"] in ("root", "column")]
    empty = psycopg.sql.SQL("")
    for host in topo.hosts:
        with db.connect(host, autocommit=True) as conn:
            for s in host.shards:
                for name in sharded:
                    table = psycopg.sql.Identifier(topo.schema_name(s), name)
                    got = conn.execute(psycopg.sql.SQL(ROWS).format(empty, table, empty)).fetchone()
                    if got[0]:
                        out[(name, s)] = (got[0], int(got[1]))
            if host.name == (topo.global_host or topo.hosts[0].name):
                for t in plan["tables"]:
                    if t["kind"] == "global":
                        table = psycopg.sql.Identifier("public", t["name"])
                        got = conn.execute(
                            psycopg.sql.SQL(ROWS).format(empty, table, empty)
                        ).fetchone()
                        out[(t["name"], None)] = (got[0], int(got[1]))
    return out


def drop_id_maps(make_fleet) -> None:
    """The id map databases the copies of a test made on its fleets' hosts, dropped (the fleet
    maker does not know them, and the hosts outlive the test: the next test's copy would find the
    id map database, and its subscription to a dropped database, under the same name)."""
    from shardctl.errors import ShardctlError
    from shardctl.ops.adopt.id_map import drop_id_map

    from .fleet import load

    for path in make_fleet.base.glob("fleet-*/shardctl.yaml"):
        topo = load(path)
        if topo.adoption is not None:
            try:
                drop_id_map(topo, topo.adoption.source, connect_timeout=3)
            except (psycopg.Error, ShardctlError):
                drop_id_map(topo, None, connect_timeout=3)
