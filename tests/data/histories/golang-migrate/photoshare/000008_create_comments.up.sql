CREATE TABLE comments (
    id          bigint PRIMARY KEY DEFAULT next_id(),
    photo_id    bigint NOT NULL REFERENCES photos (id) ON DELETE CASCADE,
    user_id     bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    body        text NOT NULL CHECK (char_length(body) BETWEEN 1 AND 2200),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX comments_photo_id_idx ON comments (photo_id, created_at);
