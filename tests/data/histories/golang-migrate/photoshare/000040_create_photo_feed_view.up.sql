CREATE VIEW photo_feed AS
SELECT p.id, p.user_id, u.username, p.caption, p.kind, p.like_count, p.created_at
  FROM photos p
  JOIN users u ON u.id = p.user_id
 WHERE u.status = 'active';
