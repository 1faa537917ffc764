ALTER TABLE books ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();

CREATE OR REPLACE FUNCTION touch_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;

CREATE TRIGGER books_touch BEFORE UPDATE ON books
    FOR EACH ROW EXECUTE FUNCTION touch_updated_at();
