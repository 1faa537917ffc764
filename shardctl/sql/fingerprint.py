"""A shard schema's catalog fingerprint: every object a migration makes, as schema-name-neutral text.

One row per object (``kind``, ``tbl`` (the table it belongs to, or ''), ``name``, ``def``) for
tables, columns (position, type, default, nullability, collation, identity/generated, privileges),
constraints, indexes, sequences' settings, functions (signature, attributes, privileges and an md5
of the body), triggers, views, types (enums with their labels, domains, ranges), row-level
security policies, default privileges, and the schema's own owner and privileges.

Each shard's own schema name, wherever the catalog spells it (``insta17.next_id()`` in a default,
``FROM insta17.photos`` in a view, ``'insta17.next_id_seq'::regclass``), is replaced by
``{schema}.``, so identical shards give identical text. What is legitimately per shard is left
out: the bodies of ``next_id()`` and of the template's other re-deployable functions (``per_shard``:
``name/nargs``; they may hold the shard number, and ``verify``, ``plan`` and ``redeploy`` compare them
with the template) and the trigger a move puts on a shard's old tables. Left out as said twice:
PostgreSQL 18's NOT NULL constraints (the column's row says ``not null``) and the index behind a
primary key, unique or exclusion constraint (the constraint's row names its columns); deparsing them
cost about half the query's time.

Cost: the deparsing functions (``pg_get_expr`` and friends) are most of the query's time, and
deparsing a call of ``next_id()`` looks the name up among every shard's ``next_id()`` (quadratic in
the shards per host), so a default that is exactly a call of the shard's own ``next_id()`` (its node
tree, compared as text) is written as ``{schema}.next_id()`` without deparsing, and any other default
without a column reference (``now()``, the same node tree on every shard) is deparsed once per distinct
node tree, not once per shard. An index without expressions or a predicate is described from
``pg_index`` (access method, columns with their operator classes, options, collations, INCLUDE
columns, storage options, tablespace) instead of ``pg_get_indexdef``: a third of the cost.

``FINGERPRINT_SQL`` folds each shard's rows, in a fixed order, into one md5 on the server (one query
per host for all its shards); ``OBJECTS_SQL`` returns the rows themselves for the few shards whose
digest differs, so the difference can be named object by object (``differences``).
"""

from __future__ import annotations

import psycopg

from .catalog import GUARD_TRIGGER

PLACEHOLDER = "{schema}."


def _n(expr: str) -> str:
    """``expr`` with the shard's own qualifier (``s.q``: its quoted name and a dot) made neutral."""
    return f"replace({expr}, s.q, '{PLACEHOLDER}')"


# Each branch: (schema, kind, tbl, name, def). Joins start from the shards' namespaces, so the cost
# is linear in the shards asked for, whatever else the database holds.
_OBJECTS = f"""
WITH s AS MATERIALIZED (
    SELECT n.oid, n.nspname::text AS schema, quote_ident(n.nspname) || '.' AS q, n.nspowner, n.nspacl,
           '{{FUNCEXPR :funcid ' || (SELECT p.oid FROM pg_proc p WHERE p.pronamespace = n.oid
                                       AND p.proname = 'next_id' AND p.proargtypes = ''::oidvector)
           || ' :funcresulttype 20 :funcretset false :funcvariadic false :funcformat 0 :funccollid 0 '
              ':inputcollid 0 :args <> :location -1}}' AS next_id_call
      FROM unnest(%(schemas)s::text[]) AS u(name) JOIN pg_namespace n ON n.nspname = u.name
), d AS MATERIALIZED (  -- column defaults, their node trees as text
    SELECT d.adrelid, d.adnum, d.adbin, d.adbin::text AS node
      FROM s JOIN pg_class c ON c.relnamespace = s.oid JOIN pg_attrdef d ON d.adrelid = c.oid
), dx AS MATERIALIZED (  -- each node tree without a column reference, deparsed once for every shard
    SELECT k.node, pg_get_expr(x.adbin, 0) AS expr
      FROM (SELECT DISTINCT ON (node) node, adrelid, adnum FROM d WHERE position('{{VAR ' IN node) = 0) AS k
      JOIN pg_attrdef x ON x.adrelid = k.adrelid AND x.adnum = k.adnum
), o(schema, kind, tbl, name, def) AS (
    SELECT s.schema, 'schema', '', '', concat_ws(' ', 'owner', pg_get_userbyid(s.nspowner), 'acl', s.nspacl::text)
      FROM s
    UNION ALL
    SELECT s.schema,
           CASE c.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence'
                          WHEN 'f' THEN 'foreign table' WHEN 'c' THEN 'type' ELSE 'table' END,
           '', c.relname::text,
           concat_ws(' ', c.relkind, c.relpersistence, 'owner', pg_get_userbyid(c.relowner), 'acl', c.relacl::text,
                     'options', c.reloptions::text, 'rls', c.relrowsecurity, c.relforcerowsecurity,
                     CASE WHEN c.relkind IN ('v', 'm') THEN {_n("pg_get_viewdef(c.oid)")} END,
                     CASE WHEN c.relkind = 'S' THEN (
                         SELECT concat_ws(' ', format_type(q.seqtypid, NULL), 'start', q.seqstart, 'increment',
                                          q.seqincrement, 'min', q.seqmin, 'max', q.seqmax, 'cache', q.seqcache,
                                          CASE WHEN q.seqcycle THEN 'cycle' END)
                           FROM pg_sequence q WHERE q.seqrelid = c.oid) END)
      FROM s JOIN pg_class c ON c.relnamespace = s.oid
     WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f', 'c')
    UNION ALL
    SELECT s.schema, 'column', c.relname::text, a.attname::text,
           concat_ws(' ', '#' || row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum),
                     {_n("format_type(a.atttypid, a.atttypmod)")},
                     CASE WHEN a.attnotnull THEN 'not null' END,
                     CASE WHEN a.attcollation <> 0 THEN 'collate ' || a.attcollation::regcollation::text END,
                     CASE WHEN a.attidentity <> '' THEN 'identity ' || a.attidentity::text END,
                     CASE WHEN a.attgenerated <> '' THEN 'generated' END,
                     'default ' || CASE WHEN d.node = s.next_id_call THEN '{PLACEHOLDER}next_id()'
                                        ELSE {_n("coalesce(dx.expr, pg_get_expr(d.adbin, d.adrelid))")} END,
                     'acl ' || a.attacl::text)
      FROM s JOIN pg_class c ON c.relnamespace = s.oid AND c.relkind IN ('r', 'p', 'f', 'c', 'v', 'm')
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN d ON d.adrelid = a.attrelid AND d.adnum = a.attnum LEFT JOIN dx ON dx.node = d.node
    UNION ALL
    SELECT s.schema, 'constraint', coalesce(c.relname, t.typname)::text, k.conname::text,
           concat_ws(' ', k.contype, {_n("pg_get_constraintdef(k.oid)")})
      FROM s JOIN pg_constraint k ON k.connamespace = s.oid AND k.contype <> 'n'
      LEFT JOIN pg_class c ON c.oid = k.conrelid LEFT JOIN pg_type t ON t.oid = k.contypid
    UNION ALL
    SELECT s.schema, 'index', c.relname::text, i.relname::text,
           CASE WHEN x.indexprs IS NULL AND x.indpred IS NULL THEN concat_ws(' ',  -- read, not deparsed: cheaper
               am.amname, CASE WHEN x.indisunique THEN 'unique' END,
               CASE WHEN x.indnullsnotdistinct THEN 'nulls not distinct' END,
               '(' || (SELECT string_agg(concat_ws(' ', quote_ident(a.attname), oc.opcname,
                                                   CASE WHEN k.opt <> 0 THEN 'option ' || k.opt END,
                                                   CASE WHEN k.coll <> 0 THEN k.coll::regcollation::text END,
                                                   CASE WHEN k.i > x.indnkeyatts THEN 'include' END),
                                         ', ' ORDER BY k.i)
                         FROM unnest(x.indkey::int2[], x.indclass::oid[], x.indoption::int2[], x.indcollation::oid[])
                              WITH ORDINALITY AS k(attnum, opclass, opt, coll, i)
                         JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
                         LEFT JOIN pg_opclass oc ON oc.oid = k.opclass) || ')',
               'with ' || i.reloptions::text,
               'tablespace ' || (SELECT t.spcname FROM pg_tablespace t WHERE t.oid = i.reltablespace))
           ELSE {_n("pg_get_indexdef(i.oid)")} END
           || CASE WHEN x.indisvalid THEN '' ELSE ' INVALID (a failed CREATE INDEX CONCURRENTLY?)' END
      FROM s JOIN pg_class c ON c.relnamespace = s.oid JOIN pg_index x ON x.indrelid = c.oid
      JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_am am ON am.oid = i.relam
     WHERE NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = i.oid AND k.conrelid = c.oid)
    UNION ALL
    SELECT s.schema, CASE p.prokind WHEN 'p' THEN 'procedure' WHEN 'a' THEN 'aggregate' ELSE 'function' END, '',
           p.proname || '(' || {_n("pg_get_function_identity_arguments(p.oid)")} || ')',
           concat_ws(' ', 'returns', {_n("pg_get_function_result(p.oid)")}, 'language', l.lanname, p.provolatile,
                     CASE WHEN p.proisstrict THEN 'strict' END, CASE WHEN p.prosecdef THEN 'security definer' END,
                     CASE WHEN p.proleakproof THEN 'leakproof' END, 'parallel', p.proparallel,
                     'config', {_n("p.proconfig::text")}, 'owner', pg_get_userbyid(p.proowner), 'acl', p.proacl::text,
                     CASE WHEN p.proname || '/' || p.pronargs = ANY(%(per_shard)s::text[])
                          THEN 'body: per shard, compared with the template'
                          ELSE 'body md5 ' || md5({_n("p.prosrc")}) END)
      FROM s JOIN pg_proc p ON p.pronamespace = s.oid JOIN pg_language l ON l.oid = p.prolang
    UNION ALL
    SELECT s.schema, 'trigger', c.relname::text, g.tgname::text,
           concat_ws(' ', {_n("pg_get_triggerdef(g.oid)")}, 'enabled', g.tgenabled)
      FROM s JOIN pg_class c ON c.relnamespace = s.oid JOIN pg_trigger g ON g.tgrelid = c.oid
     WHERE NOT g.tgisinternal AND g.tgname <> '{GUARD_TRIGGER}'
    UNION ALL
    SELECT s.schema, 'type', '', t.typname::text,
           concat_ws(' ', t.typtype, 'owner', pg_get_userbyid(t.typowner), 'acl', t.typacl::text,
                     CASE t.typtype
                         WHEN 'e' THEN 'labels ' || (SELECT string_agg(quote_literal(e.enumlabel), ', '
                                                                       ORDER BY e.enumsortorder)
                                                       FROM pg_enum e WHERE e.enumtypid = t.oid)
                         WHEN 'd' THEN concat_ws(' ', {_n("format_type(t.typbasetype, t.typtypmod)")},
                                                 CASE WHEN t.typnotnull THEN 'not null' END,
                                                 'default ' || {_n("t.typdefault")})
                         WHEN 'r' THEN (SELECT {_n("format_type(r.rngsubtype, NULL)")} FROM pg_range r
                                         WHERE r.rngtypid = t.oid)
                     END)
      FROM s JOIN pg_type t ON t.typnamespace = s.oid WHERE t.typtype IN ('e', 'd', 'r')
    UNION ALL
    SELECT s.schema, 'policy', c.relname::text, y.polname::text,
           concat_ws(' ', y.polcmd, CASE WHEN y.polpermissive THEN 'permissive' ELSE 'restrictive' END,
                     'to', array(SELECT CASE r WHEN 0 THEN 'public' ELSE pg_get_userbyid(r)::text END
                                   FROM unnest(y.polroles) AS r ORDER BY 1)::text,
                     'using', {_n("pg_get_expr(y.polqual, y.polrelid)")},
                     'check', {_n("pg_get_expr(y.polwithcheck, y.polrelid)")})
      FROM s JOIN pg_class c ON c.relnamespace = s.oid JOIN pg_policy y ON y.polrelid = c.oid
    UNION ALL
    SELECT s.schema, 'default privileges', '', pg_get_userbyid(d.defaclrole) || ' ' || d.defaclobjtype::text,
           d.defaclacl::text
      FROM s JOIN pg_default_acl d ON d.defaclnamespace = s.oid
)"""

FINGERPRINT_SQL = (
    _OBJECTS
    + """
SELECT schema, md5(string_agg(concat_ws(' ', kind, tbl, name, def), E'\\n'
                              ORDER BY kind COLLATE "C", tbl COLLATE "C", name COLLATE "C"))
  FROM o GROUP BY schema"""
)

OBJECTS_SQL = (
    _OBJECTS
    + """
SELECT schema, kind, tbl, name, def FROM o"""
)

Key = tuple[str, str, str]  # (kind, tbl, name)
NEXT_ID = ("next_id/0",)


def fingerprints(
    conn: psycopg.Connection, schemas: list[str], per_shard: tuple[str, ...] = NEXT_ID
) -> dict[str, str]:
    """Schema → the md5 of its catalog text, for the ``schemas`` that exist: one query. ``per_shard``:
    functions (``name/nargs``) whose bodies are left out."""
    if not schemas:
        return {}
    return dict(
        conn.execute(FINGERPRINT_SQL, {"schemas": schemas, "per_shard": list(per_shard)}).fetchall()
    )


def objects(
    conn: psycopg.Connection, schemas: list[str], per_shard: tuple[str, ...] = NEXT_ID
) -> dict[str, dict[Key, str]]:
    """Schema → (kind, table, name) → definition text, for a few ``schemas``."""
    out: dict[str, dict[Key, str]] = {s: {} for s in schemas}
    rows = conn.execute(OBJECTS_SQL, {"schemas": schemas, "per_shard": list(per_shard)}).fetchall()
    for schema, kind, tbl, name, definition in rows:
        out[schema][(kind, tbl, name)] = definition or ""
    return out


def _label(key: Key) -> str:
    kind, tbl, name = key
    if kind == "schema":
        return "the schema itself"
    return f"{kind} {name}" + (f" on {tbl}" if tbl else "")


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def differences(reference: dict[Key, str], shard: dict[Key, str], *, limit: int = 160) -> list[str]:
    """What ``shard`` has that ``reference`` lacks, lacks, or has otherwise, one line per object (a
    missing or extra table once, not its columns, indexes and constraints too). ``limit`` shortens
    definitions (0: whole)."""
    lost = {k[2] for k in reference.keys() - shard.keys() if k[0] == "table"}
    gained = {k[2] for k in shard.keys() - reference.keys() if k[0] == "table"}
    out = []
    for key in sorted(
        reference.keys() | shard.keys(), key=lambda k: (k[1] or k[2], k[1] != "", k[0], k[2])
    ):
        if key[0] != "table" and key[1] in (lost | gained):
            continue
        if key not in shard:
            out.append(f"missing {_label(key)}")
        elif key not in reference:
            out.append(f"extra {_label(key)}")
        elif shard[key] != reference[key]:
            mine, theirs = (
                (shard[key], reference[key])
                if not limit
                else (_short(shard[key], limit), _short(reference[key], limit))
            )
            out.append(f"{_label(key)} differs: {mine!r} (others: {theirs!r})")
    return out
