BEGIN;
CREATE TABLE photos (
    id          bigint PRIMARY KEY DEFAULT next_id(),
    user_id     bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    caption     text,
    width       integer NOT NULL CHECK (width > 0),
    height      integer NOT NULL CHECK (height > 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX photos_user_id_created_at_idx ON photos (user_id, created_at DESC);
COMMIT;
