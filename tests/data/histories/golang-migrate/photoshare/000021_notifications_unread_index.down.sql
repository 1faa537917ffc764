DROP INDEX CONCURRENTLY IF EXISTS notifications_unread_idx;
