-- What the connected role may do for a move: superuser, REPLICATION, CREATEDB, CREATE on the database,
-- pg_create_subscription membership, and how many tables in the schemas it does not own
-- (sql/catalog/inspect.py, role_facts).
--
-- In psql:
--   \set schemas '{insta4,insta5}'
--   \i shardctl/sql/queries/role_facts.sql
SELECT current_user AS name, r.rolsuper AS superuser, r.rolreplication AS replication, r.rolcreatedb AS createdb,
       has_database_privilege(current_database(), 'CREATE') AS create_on_database,
       CASE WHEN to_regrole('pg_create_subscription') IS NULL THEN false
            ELSE pg_has_role(current_user, to_regrole('pg_create_subscription'), 'MEMBER') END
           AS create_subscription,
       (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = ANY(:'schemas'::text[]) AND c.relkind IN ('r', 'p')
           AND NOT pg_has_role(current_user, c.relowner, 'USAGE'))::int AS tables_not_owned
  FROM pg_roles r WHERE r.rolname = current_user;
