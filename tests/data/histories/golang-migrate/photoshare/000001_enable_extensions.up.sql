-- Embeddings for visual search.
CREATE EXTENSION IF NOT EXISTS vector;
