CREATE TABLE stories (
    id          bigint PRIMARY KEY DEFAULT next_id(),
    user_id     bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    kind        media_kind NOT NULL DEFAULT 'photo',
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL DEFAULT now() + interval '24 hours'
);
