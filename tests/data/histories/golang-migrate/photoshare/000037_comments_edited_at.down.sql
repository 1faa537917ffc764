DROP TRIGGER IF EXISTS comments_mark_edited ON comments;
DROP FUNCTION IF EXISTS comments_mark_edited();
ALTER TABLE comments DROP COLUMN edited_at;
