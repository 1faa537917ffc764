ALTER TABLE users
    ADD COLUMN follower_count integer NOT NULL DEFAULT 0,
    ADD COLUMN following_count integer NOT NULL DEFAULT 0;
