CREATE TABLE hashtags (
    id          bigint PRIMARY KEY DEFAULT next_id(),
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
