-- Every write privilege on the tables of the schemas but the owner's: (schema, table, grantee as SQL
-- (a quoted role or PUBLIC), privilege). A move revokes them on the old copy and gives them back on
-- an abort (sql/catalog/stubs.py, write_grants).
--
-- In psql:
--   \set schemas '{insta4,insta5}'
--   \set privileges '{INSERT,UPDATE,DELETE,TRUNCATE}'
--   \i shardctl/sql/queries/write_grants.sql
SELECT n.nspname, c.relname,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
       a.privilege_type
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
       aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) AS a
 WHERE n.nspname = ANY(:'schemas'::text[]) AND c.relkind IN ('r', 'p')
   AND a.privilege_type = ANY(:'privileges'::text[])
   AND a.grantee <> c.relowner
 ORDER BY 1, 2, 3, 4;
