-- A server's version, replication settings and how much of them is in use, and the database's
-- encoding: what a move's preflight checks on both hosts (sql/catalog/inspect.py, server_facts).
-- lock_processes: the processes the shared lock table is sized for (it holds about
-- max_locks_per_transaction x lock_processes locks, whichever transactions hold them; PostgreSQL's
-- MaxBackends plus prepared transactions; autovacuum_worker_slots is PostgreSQL 18's).
--
-- In psql: \i shardctl/sql/queries/server_facts.sql
SELECT current_setting('server_version_num')::int AS version_num,
       current_setting('wal_level') AS wal_level,
       current_setting('max_replication_slots')::int AS max_replication_slots,
       (SELECT count(*) FROM pg_replication_slots)::int AS slots_used,
       current_setting('max_wal_senders')::int AS max_wal_senders,
       current_setting('max_logical_replication_workers')::int AS max_logical_replication_workers,
       current_setting('log_statement') AS log_statement,
       (SELECT count(*) FROM pg_stat_replication)::int AS senders_used,
       greatest((SELECT count(*) FROM pg_stat_subscription WHERE pid IS NOT NULL),
                (SELECT count(*) FROM pg_subscription WHERE subenabled))::int AS workers_used,
       current_setting('max_sync_workers_per_subscription')::int AS max_sync_workers_per_subscription,
       current_setting('server_encoding') AS server_encoding,
       current_setting('max_locks_per_transaction')::int AS max_locks_per_transaction,
       (current_setting('max_connections')::int
        + current_setting('max_prepared_transactions')::int
        + coalesce(current_setting('autovacuum_worker_slots', true),
                   current_setting('autovacuum_max_workers'))::int
        + 2 + current_setting('max_worker_processes')::int
        + current_setting('max_wal_senders')::int) AS lock_processes;
