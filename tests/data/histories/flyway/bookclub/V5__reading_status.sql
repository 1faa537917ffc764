-- Re-runnable by hand: create the type only when it is not there yet.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_type WHERE typname = 'reading_status') THEN
        CREATE TYPE reading_status AS ENUM ('planned', 'reading', 'finished');
    END IF;
END
$$;

CREATE TABLE reading_list (
    club_id  bigint NOT NULL REFERENCES clubs (id) ON DELETE CASCADE,
    book_id  bigint NOT NULL REFERENCES books (id),
    status   reading_status NOT NULL DEFAULT 'planned',
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (club_id, book_id)
);
