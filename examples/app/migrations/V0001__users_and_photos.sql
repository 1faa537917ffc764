-- The example app's tables, created in every shard. Every id defaults to the
-- shard's next_id(), so an id names the shard its row lives on.
CREATE TABLE {{ schema|ident }}.users (
    id          bigint PRIMARY KEY DEFAULT {{ next_id }}(),
    username    text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Photos live on their owner's shard: a user's photos are one query on one host.
CREATE TABLE {{ schema|ident }}.photos (
    id          bigint PRIMARY KEY DEFAULT {{ next_id }}(),
    user_id     bigint NOT NULL REFERENCES {{ schema|ident }}.users (id),
    caption     text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX photos_user_id_idx ON {{ schema|ident }}.photos (user_id, id DESC);
