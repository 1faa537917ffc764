ALTER TABLE hashtags ADD CONSTRAINT hashtags_name_lower CHECK (name = lower(name));
