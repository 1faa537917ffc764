-- One club name per owner. Guarded so a hand-applied hotfix does not break the deploy.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
         WHERE conname = 'clubs_owner_name_key'
    ) THEN
        ALTER TABLE clubs ADD CONSTRAINT clubs_owner_name_key UNIQUE (owner_id, name);
    END IF;
END
$$;
