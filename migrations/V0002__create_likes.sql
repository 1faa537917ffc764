CREATE TABLE {{ schema|ident }}.likes (
    id          bigint PRIMARY KEY DEFAULT {{ next_id }}(),
    photo_id    bigint NOT NULL,
    user_id     bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (photo_id, user_id)
);
