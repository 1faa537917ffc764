CREATE VIEW club_stats AS
SELECT c.id AS club_id,
       c.name,
       count(DISTINCT m.member_id) AS members,
       count(DISTINCT r.book_id) FILTER (WHERE r.status = 'finished') AS books_finished
  FROM clubs c
  LEFT JOIN club_members m ON m.club_id = c.id
  LEFT JOIN reading_list r ON r.club_id = c.id
 GROUP BY c.id, c.name;
