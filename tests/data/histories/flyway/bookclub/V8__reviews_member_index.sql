-- Large table in production: build the index without blocking writes.
CREATE INDEX CONCURRENTLY IF NOT EXISTS reviews_member_id_idx ON reviews (member_id, created_at DESC);
