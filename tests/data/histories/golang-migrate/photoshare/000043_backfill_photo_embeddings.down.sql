DELETE FROM photo_embeddings WHERE embedding = '[0,0,0,0,0,0,0,1]'::vector;
