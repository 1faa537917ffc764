CREATE TABLE notifications (
    id          bigint PRIMARY KEY DEFAULT next_id(),
    user_id     bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    kind        text NOT NULL,
    payload     jsonb NOT NULL DEFAULT '{}'::jsonb,
    read_at     timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now()
);
