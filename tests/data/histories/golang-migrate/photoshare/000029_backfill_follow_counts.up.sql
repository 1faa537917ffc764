-- Data migration: the counters start from the follows already recorded.
UPDATE users u
   SET follower_count = f.n
  FROM (SELECT followee_id, count(*) AS n FROM follows GROUP BY followee_id) f
 WHERE f.followee_id = u.id;

UPDATE users u
   SET following_count = f.n
  FROM (SELECT follower_id, count(*) AS n FROM follows GROUP BY follower_id) f
 WHERE f.follower_id = u.id;
