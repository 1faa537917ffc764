-- A SQL-standard body: its tables are bound when the function is created, so each
-- shard's copy reads its own shard's blocks whatever the caller's search_path.
CREATE FUNCTION is_blocked(a bigint, b bigint) RETURNS boolean
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT EXISTS (
        SELECT 1 FROM blocks
         WHERE (blocker_id = a AND blocked_id = b) OR (blocker_id = b AND blocked_id = a)
    );
END;
