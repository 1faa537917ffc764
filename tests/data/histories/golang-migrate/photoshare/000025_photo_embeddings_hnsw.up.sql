CREATE INDEX photo_embeddings_hnsw_idx ON photo_embeddings USING hnsw (embedding vector_cosine_ops);
