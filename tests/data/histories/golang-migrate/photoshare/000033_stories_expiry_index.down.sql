DROP INDEX IF EXISTS stories_expires_at_idx;
