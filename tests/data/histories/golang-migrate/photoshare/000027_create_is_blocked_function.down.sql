DROP FUNCTION IF EXISTS is_blocked(bigint, bigint);
