"""``verify``'s set-based reads: one row per host, every shard's next_id() shape and body, sampled IDs,
and the ID sequences' settings."""

from __future__ import annotations

import psycopg

from ...model.identifiers import quote_ident
from .. import queries
from .control import NOT_STUB


def id_sequence_settings(conn: psycopg.Connection, schemas: list[str]) -> dict[str, dict]:
    """schema → cache_size and increment_by of its ``next_id_seq`` (what verify checks: CACHE 1, INCREMENT 1).
    Read from ``pg_sequence``, not the ``pg_sequences`` view: the view reads every sequence's last
    value (opening each) before the filter applies: 26 ms against 10 ms at 2,048 shards."""
    return {
        r[0]: {"cache_size": r[1], "increment_by": r[2]}
        for r in conn.execute(
            """SELECT n.nspname::text, q.seqcache, q.seqincrement
                 FROM pg_namespace n JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'next_id_seq'
                 JOIN pg_sequence q ON q.seqrelid = c.oid
                WHERE n.nspname = ANY(%s)""",
            (schemas,),
        ).fetchall()
    }


# verify: one row per host with its version, clock, whether the control schema exists, and every schema name
# (but the stubs under moved shards' old names).
VERIFY_HOST_SQL = f"""SELECT current_setting('server_version'), extract(epoch FROM clock_timestamp())::float8,
       to_regclass('shardctl.migrations') IS NOT NULL,
       array(SELECT nspname::text FROM pg_namespace n WHERE {NOT_STUB})"""


def active_shard_ids(conn: psycopg.Connection) -> set[int]:
    return {
        r[0]
        for r in conn.execute(
            "SELECT shard_id FROM shardctl.shards WHERE state = 'active'"
        ).fetchall()
    }


# A next_id() body with its shard's schema name and shard number (as a whole number) taken out: the
# same for every shard rendered from one template, whatever its number. Linear in the rows: one fixed
# pattern (compiled once per query, not once per row) brackets every run of digits, so the shard number
# as a whole number is a plain replace of '<N>'.
_SHAPE = (
    "md5(replace(regexp_replace(replace({body}, {schema}, '{{schema}}'), '([0-9]+)', '<\\1>', 'g'), "
    "'<' || {shard}::text || '>', '{{shard}}'))"
)


# A schema's next_id(): the whole key of pg_proc's (proname, proargtypes, pronamespace) index, so a
# nested-loop plan (stale catalog statistics right after init) looks each one up instead of scanning
# every shard's next_id() per shard.
_NEXT_ID = "p.proname = 'next_id' AND p.proargtypes = ''::oidvector"


def next_id_shapes(
    conn: psycopg.Connection,
    schemas: list[str],
    shards: list[int],
    expected: tuple[list[str], list[str], list[int]],
) -> tuple[dict[str | None, list[int]], set[str], list[int]]:
    """Every shard's next_id() shape (None: no next_id()) → its shards, the shapes of the ``expected``
    (bodies, schemas, shards) renderings, and the shards without a ``next_id_seq`` sequence: two
    set-based queries."""
    shape = _SHAPE.format(body="p.prosrc", schema="u.schema", shard="u.shard")
    rows = conn.execute(
        f"""SELECT {shape}, array_agg(u.shard),
                   array_agg(u.shard) FILTER (WHERE NOT EXISTS (
                       SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'next_id_seq'
                          AND c.relkind = 'S'))
              FROM unnest(%s::text[], %s::int[]) AS u(schema, shard)
              LEFT JOIN pg_namespace n ON n.nspname = u.schema
              LEFT JOIN pg_proc p ON p.pronamespace = n.oid AND {_NEXT_ID}
             GROUP BY 1""",
        (schemas, shards),
    ).fetchall()
    known = conn.execute(
        f"SELECT DISTINCT {_SHAPE.format(body='e.body', schema='e.schema', shard='e.shard')} "
        "FROM unnest(%s::text[], %s::text[], %s::int[]) AS e(body, schema, shard)",
        expected,
    ).fetchall()
    no_sequence = [n for r in rows for n in (r[2] or [])]
    return {r[0]: list(r[1]) for r in rows}, {r[0] for r in known}, no_sequence


def next_id_bodies(conn: psycopg.Connection, schemas: list[str]) -> dict[str, str]:
    """Schema → its next_id() body (``pg_proc.prosrc``), for the schemas given."""
    if not schemas:
        return {}
    return dict(
        conn.execute(
            f"""SELECT n.nspname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE {_NEXT_ID} AND n.nspname = ANY(%s)""",
            (schemas,),
        ).fetchall()
    )


SAMPLE_BATCH = 256  # shards per UNION ALL query when no temporary function can be made


# shards per call of the function: each is a transaction holding a lock per sequence
SAMPLE_CALL = 1024


def sample_next_ids(
    conn: psycopg.Connection, schemas: list[str], shards: list[int], n: int
) -> list[tuple[int, list[int] | None, int, str | None]]:
    """(shard, ``n`` IDs from its next_id(), server time in ms after them, error or None) per shard:
    one query, or (a role that may not make temporary objects, a standby) UNION ALL batches."""
    if not shards:
        return []
    try:
        conn.execute(queries.load("sample_ids_function"))
    except psycopg.Error:
        return _sample_union(conn, schemas, shards, n)
    out: list[tuple] = []
    # max_locks_per_transaction: 64 x max_connections slots
    for i in range(0, len(shards), SAMPLE_CALL):
        out += conn.execute(
            "SELECT * FROM pg_temp.shardctl_sample_ids(%s::text[], %s::int[], %s)",
            (schemas[i : i + SAMPLE_CALL], shards[i : i + SAMPLE_CALL], n),
        ).fetchall()
    return out


def _one_id_sql(schema: str, shard: int) -> str:
    return (
        f"SELECT {int(shard)}, {quote_ident(schema)}.next_id(), "
        f"(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
    )


def mint_one_id(
    conn: psycopg.Connection, schemas: list[str], shards: list[int]
) -> list[tuple[int, int, int]]:
    """(shard, one ID from its next_id(), server time in ms after it) per shard: one UNION ALL query."""
    return conn.execute(
        "\nUNION ALL\n".join(_one_id_sql(s, n) for s, n in zip(schemas, shards))
    ).fetchall()


def _sample_union(
    conn: psycopg.Connection, schemas: list[str], shards: list[int], n: int
) -> list[tuple]:
    def one(schema: str, shard: int) -> str:
        fn = f"{quote_ident(schema)}.next_id"
        return (
            f"SELECT {int(shard)}, (SELECT array_agg({fn}() ORDER BY g) FROM generate_series(1, {int(n)}) g), "
            f"(extract(epoch FROM clock_timestamp()) * 1000)::bigint, NULL::text"
        )

    out: list[tuple] = []
    for i in range(0, len(shards), SAMPLE_BATCH):
        part = list(zip(schemas[i : i + SAMPLE_BATCH], shards[i : i + SAMPLE_BATCH]))
        try:
            out += conn.execute("\nUNION ALL\n".join(one(s, k) for s, k in part)).fetchall()
        except psycopg.Error:
            for schema, shard in part:  # find the shard(s) whose next_id() fails
                try:
                    out.append(conn.execute(one(schema, shard)).fetchone())
                except psycopg.Error as exc:
                    out.append((shard, None, 0, str(exc)))
    return out


def database_facts(conn: psycopg.Connection) -> tuple[str, int]:
    """The connection's database encoding and the server's version number (verify builds its reference
    database in that encoding, and may share it only between servers of one major version)."""
    return conn.execute(
        """SELECT pg_encoding_to_char(encoding), current_setting('server_version_num')::int
             FROM pg_database WHERE datname = current_database()"""
    ).fetchone()


# pg_default_acl.defaclobjtype → the word ALTER DEFAULT PRIVILEGES uses
_DEFAULT_ACL_OBJECTS = {
    "r": "TABLES",
    "S": "SEQUENCES",
    "f": "FUNCTIONS",
    "T": "TYPES",
    "n": "SCHEMAS",
}


def default_privilege_statements(conn: psycopg.Connection) -> list[str]:
    """``ALTER DEFAULT PRIVILEGES`` statements that make a fresh database's database-wide default
    privileges (those set without ``IN SCHEMA``) the same as the connection's database: for each role
    and kind of object, everything revoked, then each item of the stored ACL granted again in its order.
    verify's reference database needs them: a shard's new tables take them, as the reference's must."""
    rows = conn.execute(
        """SELECT pg_get_userbyid(d.defaclrole), d.defaclobjtype::text,
                  array_agg(a.privilege_type ORDER BY a.ord),
                  array_agg(CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
                            ORDER BY a.ord),
                  array_agg(a.is_grantable ORDER BY a.ord)
             FROM pg_default_acl d
             CROSS JOIN LATERAL (SELECT x.*, row_number() OVER () AS ord FROM aclexplode(d.defaclacl) x) a
            WHERE d.defaclnamespace = 0
            GROUP BY 1, 2 ORDER BY 1, 2"""
    ).fetchall()
    out = []
    for role, kind, privileges, grantees, grantable in rows:
        what = _DEFAULT_ACL_OBJECTS.get(kind)
        if what is None:
            continue
        head = f"ALTER DEFAULT PRIVILEGES FOR ROLE {quote_ident(role)}"
        out.append(f"{head} REVOKE ALL ON {what} FROM PUBLIC, {quote_ident(role)}")
        out += [
            f"{head} GRANT {privilege} ON {what} TO {grantee}"
            + (" WITH GRANT OPTION" if option else "")
            for privilege, grantee, option in zip(privileges, grantees, grantable)
        ]
    return out


def available_extensions(conn: psycopg.Connection) -> list[tuple[str, str]]:
    """(name, default version) of every extension the server could install: a host-level
    ``CREATE EXTENSION`` in verify's reference takes the default version, so a changed package
    changes the reference (its cache is keyed by this list)."""
    return conn.execute(
        "SELECT name, coalesce(default_version, '') FROM pg_available_extensions ORDER BY 1"
    ).fetchall()


def idle_databases(conn: psycopg.Connection, prefix: str) -> list[str]:
    """The databases whose name starts with ``prefix`` and that no session is connected to."""
    return [
        name
        for (name,) in conn.execute(
            """SELECT d.datname FROM pg_database d
                WHERE starts_with(d.datname, %s)
                  AND NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.datid = d.oid)""",
            (prefix,),
        )
    ]
