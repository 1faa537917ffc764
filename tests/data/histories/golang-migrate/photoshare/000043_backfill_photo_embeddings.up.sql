-- Data migration: a placeholder embedding for photos indexed before visual search.
INSERT INTO photo_embeddings (photo_id, embedding)
SELECT p.id, '[0,0,0,0,0,0,0,1]'::vector
  FROM photos p
 WHERE NOT EXISTS (SELECT 1 FROM photo_embeddings e WHERE e.photo_id = p.id);
