DROP INDEX IF EXISTS photo_embeddings_hnsw_idx;
