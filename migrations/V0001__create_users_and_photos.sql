-- Example app: Instagram-like tables. Every id defaults to this shard's next_id(),
-- so any id names the shard its row lives on.
CREATE TABLE {{ schema|ident }}.users (
    id          bigint PRIMARY KEY DEFAULT {{ next_id }}(),
    username    text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{ schema|ident }}.photos (
    id          bigint PRIMARY KEY DEFAULT {{ next_id }}(),
    user_id     bigint NOT NULL,
    caption     text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX photos_user_id_idx ON {{ schema|ident }}.photos (user_id, id DESC);
