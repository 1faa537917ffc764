ALTER TABLE photos ADD COLUMN like_count integer NOT NULL DEFAULT 0;
