-- Every object of the shard schemas asked for, one row each: (schema, kind, table, name, definition),
-- with each shard's own schema name made neutral ({schema}.), so that shards rendered from one history
-- give the same rows. sql/fingerprint.py hashes them per schema (verify, status) or compares them
-- object by object (verify --full).
--
-- In psql:
--   \set schemas '{insta0,insta1}'
--   \set per_shard '{next_id/0}'
-- (per_shard: the functions, as name/argument count, whose bodies differ per shard: left out). The
-- trigger 'shardctl_moved_shard' left out below is sql/catalog/control.py's GUARD_TRIGGER.
--   \i shardctl/sql/queries/fingerprint_objects.sql
WITH s AS MATERIALIZED (
    SELECT n.oid, n.nspname::text AS schema, quote_ident(n.nspname) || '.' AS q, n.nspowner, n.nspacl,
           '{FUNCEXPR :funcid ' || (SELECT p.oid FROM pg_proc p WHERE p.pronamespace = n.oid
                                       AND p.proname = 'next_id' AND p.proargtypes = ''::oidvector)
           || ' :funcresulttype 20 :funcretset false :funcvariadic false :funcformat 0 :funccollid 0 '
              ':inputcollid 0 :args <> :location -1}' AS next_id_call
      FROM unnest(:'schemas'::text[]) AS u(name) JOIN pg_namespace n ON n.nspname = u.name
), d AS MATERIALIZED (  -- column defaults, their node trees as text; own: a call of its shard's next_id()
    SELECT d.adrelid, d.adnum, d.adbin, d.adbin::text AS node, d.adbin::text = s.next_id_call AS own
      FROM s JOIN pg_class c ON c.relnamespace = s.oid JOIN pg_attrdef d ON d.adrelid = c.oid
), dx AS MATERIALIZED (  -- each other node tree without a column reference, deparsed once for every
                         -- shard (a next_id() call differs per shard: deparsing them all was ~15%)
    SELECT k.node, pg_get_expr(x.adbin, 0) AS expr
      FROM (SELECT DISTINCT ON (node) node, adrelid, adnum FROM d
             WHERE NOT own AND position('{VAR ' IN node) = 0) AS k
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
                     CASE WHEN c.relkind IN ('v', 'm') THEN replace(pg_get_viewdef(c.oid), s.q, '{schema}.') END,
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
                     replace(format_type(a.atttypid, a.atttypmod), s.q, '{schema}.'),
                     CASE WHEN a.attnotnull THEN 'not null' END,
                     CASE WHEN a.attcollation <> 0 THEN 'collate ' || a.attcollation::regcollation::text END,
                     CASE WHEN a.attidentity <> '' THEN 'identity ' || a.attidentity::text END,
                     CASE WHEN a.attgenerated <> '' THEN 'generated' END,
                     'default ' || CASE WHEN d.own THEN '{schema}.next_id()'
                                        ELSE replace(coalesce(dx.expr, pg_get_expr(d.adbin, d.adrelid)), s.q, '{schema}.') END,
                     'acl ' || a.attacl::text)
      FROM s JOIN pg_class c ON c.relnamespace = s.oid AND c.relkind IN ('r', 'p', 'f', 'c', 'v', 'm')
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN d ON d.adrelid = a.attrelid AND d.adnum = a.attnum LEFT JOIN dx ON dx.node = d.node
    UNION ALL
    SELECT s.schema, 'constraint', coalesce(c.relname, t.typname)::text, k.conname::text,
           concat_ws(' ', k.contype, replace(pg_get_constraintdef(k.oid), s.q, '{schema}.'))
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
           ELSE replace(pg_get_indexdef(i.oid), s.q, '{schema}.') END
           || CASE WHEN x.indisvalid THEN '' ELSE ' INVALID (a failed CREATE INDEX CONCURRENTLY?)' END
      FROM s JOIN pg_class c ON c.relnamespace = s.oid JOIN pg_index x ON x.indrelid = c.oid
      JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_am am ON am.oid = i.relam
     WHERE NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = i.oid AND k.conrelid = c.oid)
    UNION ALL
    SELECT s.schema, CASE p.prokind WHEN 'p' THEN 'procedure' WHEN 'a' THEN 'aggregate' ELSE 'function' END, '',
           p.proname || '(' || replace(pg_get_function_identity_arguments(p.oid), s.q, '{schema}.') || ')',
           concat_ws(' ', 'returns', replace(pg_get_function_result(p.oid), s.q, '{schema}.'), 'language', l.lanname, p.provolatile,
                     CASE WHEN p.proisstrict THEN 'strict' END, CASE WHEN p.prosecdef THEN 'security definer' END,
                     CASE WHEN p.proleakproof THEN 'leakproof' END, 'parallel', p.proparallel,
                     'config', replace(p.proconfig::text, s.q, '{schema}.'), 'owner', pg_get_userbyid(p.proowner), 'acl', p.proacl::text,
                     CASE WHEN p.proname || '/' || p.pronargs = ANY(:'per_shard'::text[])
                          THEN 'body: per shard, compared with the template'
                          ELSE 'body md5 ' || md5(replace(p.prosrc, s.q, '{schema}.')) END)
      FROM s JOIN pg_proc p ON p.pronamespace = s.oid JOIN pg_language l ON l.oid = p.prolang
    UNION ALL
    SELECT s.schema, 'trigger', c.relname::text, g.tgname::text,
           concat_ws(' ', replace(pg_get_triggerdef(g.oid), s.q, '{schema}.'), 'enabled', g.tgenabled)
      FROM s JOIN pg_class c ON c.relnamespace = s.oid JOIN pg_trigger g ON g.tgrelid = c.oid
     WHERE NOT g.tgisinternal AND g.tgname <> 'shardctl_moved_shard'
    UNION ALL
    SELECT s.schema, 'type', '', t.typname::text,
           concat_ws(' ', t.typtype, 'owner', pg_get_userbyid(t.typowner), 'acl', t.typacl::text,
                     CASE t.typtype
                         WHEN 'e' THEN 'labels ' || (SELECT string_agg(quote_literal(e.enumlabel), ', '
                                                                       ORDER BY e.enumsortorder)
                                                       FROM pg_enum e WHERE e.enumtypid = t.oid)
                         WHEN 'd' THEN concat_ws(' ', replace(format_type(t.typbasetype, t.typtypmod), s.q, '{schema}.'),
                                                 CASE WHEN t.typnotnull THEN 'not null' END,
                                                 'default ' || replace(t.typdefault, s.q, '{schema}.'))
                         WHEN 'r' THEN (SELECT replace(format_type(r.rngsubtype, NULL), s.q, '{schema}.') FROM pg_range r
                                         WHERE r.rngtypid = t.oid)
                     END)
      FROM s JOIN pg_type t ON t.typnamespace = s.oid WHERE t.typtype IN ('e', 'd', 'r')
    UNION ALL
    SELECT s.schema, 'policy', c.relname::text, y.polname::text,
           concat_ws(' ', y.polcmd, CASE WHEN y.polpermissive THEN 'permissive' ELSE 'restrictive' END,
                     'to', array(SELECT CASE r WHEN 0 THEN 'public' ELSE pg_get_userbyid(r)::text END
                                   FROM unnest(y.polroles) AS r ORDER BY 1)::text,
                     'using', replace(pg_get_expr(y.polqual, y.polrelid), s.q, '{schema}.'),
                     'check', replace(pg_get_expr(y.polwithcheck, y.polrelid), s.q, '{schema}.'))
      FROM s JOIN pg_class c ON c.relnamespace = s.oid JOIN pg_policy y ON y.polrelid = c.oid
    UNION ALL
    SELECT s.schema, 'default privileges', '', pg_get_userbyid(d.defaclrole) || ' ' || d.defaclobjtype::text,
           d.defaclacl::text
      FROM s JOIN pg_default_acl d ON d.defaclnamespace = s.oid
)
SELECT schema, kind, tbl, name, def FROM o;
