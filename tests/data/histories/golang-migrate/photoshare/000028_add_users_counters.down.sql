ALTER TABLE users DROP COLUMN follower_count, DROP COLUMN following_count;
