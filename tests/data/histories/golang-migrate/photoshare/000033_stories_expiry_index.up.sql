CREATE INDEX stories_expires_at_idx ON stories (expires_at);
