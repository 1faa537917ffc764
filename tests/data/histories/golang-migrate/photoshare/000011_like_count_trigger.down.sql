DROP TRIGGER IF EXISTS likes_count ON likes;
DROP FUNCTION IF EXISTS photos_like_count();
