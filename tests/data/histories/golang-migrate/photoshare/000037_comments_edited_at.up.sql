ALTER TABLE comments ADD COLUMN edited_at timestamptz;

CREATE OR REPLACE FUNCTION comments_mark_edited() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.body IS DISTINCT FROM OLD.body THEN
        NEW.edited_at := now();
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER comments_mark_edited
    BEFORE UPDATE OF body ON comments
    FOR EACH ROW EXECUTE FUNCTION comments_mark_edited();
