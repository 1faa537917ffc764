DROP TABLE IF EXISTS photo_embeddings;
