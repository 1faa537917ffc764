ALTER TABLE photos DROP COLUMN like_count;
