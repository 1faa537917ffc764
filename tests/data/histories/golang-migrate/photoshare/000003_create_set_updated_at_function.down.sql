DROP FUNCTION IF EXISTS set_updated_at();
