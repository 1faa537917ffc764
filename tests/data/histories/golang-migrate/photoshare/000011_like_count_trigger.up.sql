CREATE OR REPLACE FUNCTION photos_like_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE photos SET like_count = like_count + 1 WHERE id = NEW.photo_id;
        RETURN NEW;
    END IF;
    UPDATE photos SET like_count = like_count - 1 WHERE id = OLD.photo_id;
    RETURN OLD;
END
$$;

CREATE TRIGGER likes_count
    AFTER INSERT OR DELETE ON likes
    FOR EACH ROW EXECUTE FUNCTION photos_like_count();
