ALTER TABLE hashtags DROP CONSTRAINT IF EXISTS hashtags_name_lower;
