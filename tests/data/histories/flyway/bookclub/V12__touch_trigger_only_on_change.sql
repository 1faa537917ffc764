-- Touch updated_at only when something changed.
DROP TRIGGER IF EXISTS books_touch ON books;

CREATE TRIGGER books_touch BEFORE UPDATE ON books
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION touch_updated_at();

COMMENT ON TABLE books IS 'Books the clubs read.';
