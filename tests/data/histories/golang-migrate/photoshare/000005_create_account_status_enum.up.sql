DO $$
BEGIN
    -- Look only in this shard's schema: another shard's type of the same name is not ours.
    IF NOT EXISTS (
        SELECT 1 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE t.typname = 'account_status' AND n.nspname = current_schema()
    ) THEN
        CREATE TYPE account_status AS ENUM ('active', 'suspended', 'deleted');
    END IF;
END
$$;
