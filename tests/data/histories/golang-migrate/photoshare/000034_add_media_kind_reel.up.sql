DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_enum e
          JOIN pg_type t ON t.oid = e.enumtypid
          JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE n.nspname = current_schema() AND t.typname = 'media_kind' AND e.enumlabel = 'reel'
    ) THEN
        ALTER TYPE media_kind ADD VALUE 'reel';
    END IF;
END
$$;
