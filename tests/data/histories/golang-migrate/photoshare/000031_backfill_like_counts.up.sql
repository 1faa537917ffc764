-- Data migration: likes recorded before the trigger existed.
UPDATE photos p
   SET like_count = l.n
  FROM (SELECT photo_id, count(*) AS n FROM likes GROUP BY photo_id) l
 WHERE l.photo_id = p.id AND p.like_count <> l.n;
