-- Generated data for forum_django.sql: :users users (psql variable, default in the test), a few
-- threads and posts each, some post bodies large enough to be stored out of line (TOAST).
INSERT INTO django_migrations (app, name, applied)
SELECT app, name, now() - (40 - n) * interval '1 day'
  FROM (VALUES (1, 'contenttypes', '0001_initial'), (2, 'auth', '0001_initial'),
               (3, 'auth', '0012_alter_user_first_name_max_length'), (4, 'accounts', '0001_initial'),
               (5, 'forum', '0001_initial'), (6, 'forum', '0002_attachment'),
               (7, 'forum', '0003_vote_threadview')) AS m(n, app, name) ORDER BY n;
INSERT INTO django_content_type (app_label, model)
VALUES ('auth', 'user'), ('forum', 'board'), ('forum', 'thread'), ('forum', 'post');
INSERT INTO forum_board (name, slug, position)
SELECT 'Board ' || b, 'board-' || b, b FROM generate_series(1, 5) AS b;
INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email, is_staff,
                       is_active, date_joined)
SELECT 'pbkdf2_sha256$600000$' || md5(u::text), u = 1, 'user' || u, 'First' || u, 'Last' || u,
       'user' || u || '@example.org', false, true, now() - u * interval '1 hour'
  FROM generate_series(1, :users) AS u;
INSERT INTO accounts_profile (bio, user_id) SELECT 'about user ' || id, id FROM auth_user;
INSERT INTO forum_thread (title, created, pinned, author_id, board_id)
SELECT 'Thread ' || u || '.' || t, now(), false, u, 1 + (u + t) % 5
  FROM generate_series(1, :users) AS u, generate_series(1, 2) AS t;
INSERT INTO forum_post (body, created, author_id, thread_id)
SELECT CASE WHEN p.id % 7 = 0
            THEN (SELECT string_agg(md5(p.id::text || g), ' ') FROM generate_series(1, 300) AS g)
            ELSE 'post ' || p.id END,
       now(), 1 + (p.id * 7) % :users, p.id
  FROM forum_thread AS p, generate_series(1, 3) AS n;
INSERT INTO forum_attachment (filename, content_type, post_id)
SELECT 'file' || id || '.png', 'image/png', id FROM forum_post WHERE id % 5 = 0;
INSERT INTO forum_vote (value, post_id, user_id)
SELECT 1, id, 1 + (id * 3) % :users FROM forum_post WHERE id % 2 = 0;
INSERT INTO forum_threadview (user_id, thread_id, viewed)
SELECT author_id, id, now() FROM forum_thread;
ANALYZE;
