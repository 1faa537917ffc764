-- pg_temp.shardctl_sample_ids(schemas, shards, n): calls every shard's next_id() n times in one query,
-- a function of the session's own (pg_temp: gone when the connection closes). A shard whose
-- next_id() fails gets its error, not an abort. verify samples IDs with it (sql/catalog/verify.py).
--
-- In psql:
--   \i shardctl/sql/queries/sample_ids_function.sql
--   SELECT * FROM pg_temp.shardctl_sample_ids('{insta0,insta1}', '{0,1}', 3);
CREATE OR REPLACE FUNCTION pg_temp.shardctl_sample_ids(schemas text[], shards int[], n int)
RETURNS TABLE (shard int, ids bigint[], at_ms bigint, error text) LANGUAGE plpgsql AS $sample$
BEGIN
    FOR i IN 1 .. coalesce(array_length(schemas, 1), 0) LOOP
        shard := shards[i];
        ids := NULL;
        error := NULL;
        BEGIN
            EXECUTE format('SELECT array_agg(%I.next_id() ORDER BY g) FROM generate_series(1, $1) AS g',
                           schemas[i]) INTO ids USING n;
        EXCEPTION WHEN OTHERS THEN
            error := SQLERRM;
        END;
        at_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        RETURN NEXT;
    END LOOP;
END
$sample$;
