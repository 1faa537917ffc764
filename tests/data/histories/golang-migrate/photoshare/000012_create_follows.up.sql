CREATE TABLE follows (
    follower_id  bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    followee_id  bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (follower_id, followee_id),
    CONSTRAINT follows_not_self CHECK (follower_id <> followee_id)
);
CREATE INDEX follows_followee_id_idx ON follows (followee_id);
