CREATE INDEX CONCURRENTLY IF NOT EXISTS notifications_unread_idx
    ON notifications (user_id, created_at DESC) WHERE read_at IS NULL;
