CREATE TABLE photo_embeddings (
    photo_id    bigint PRIMARY KEY REFERENCES photos (id) ON DELETE CASCADE,
    model       text NOT NULL DEFAULT 'clip-v1',
    embedding   vector(8) NOT NULL
);
