DO $$
BEGIN
    -- Some shards were created by an old script with this column; the check stays in this shard's schema.
    IF EXISTS (
        SELECT 1 FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = 'photos' AND column_name = 'legacy_url'
    ) THEN
        ALTER TABLE photos DROP COLUMN legacy_url;
    END IF;
END
$$;
