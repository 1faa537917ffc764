CREATE TABLE likes (
    photo_id    bigint NOT NULL REFERENCES photos (id) ON DELETE CASCADE,
    user_id     bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (photo_id, user_id)
);
CREATE INDEX likes_user_id_idx ON likes (user_id);
