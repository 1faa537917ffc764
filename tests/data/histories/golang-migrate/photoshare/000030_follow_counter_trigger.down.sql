DROP TRIGGER IF EXISTS follows_counters ON follows;
DROP FUNCTION IF EXISTS follows_counters();
