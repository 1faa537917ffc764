-- Generated data for tasks_prisma.sql: :users users, two projects each, tasks with labels, some
-- task bodies large enough to be stored out of line (TOAST).
INSERT INTO "_prisma_migrations" (id, checksum, finished_at, migration_name, applied_steps_count)
SELECT md5(n::text)::uuid::text, md5(name), now() - (10 - n) * interval '1 day', name, 1
  FROM (VALUES (1, '20250103101500_init'), (2, '20250210093000_add_tasks'),
               (3, '20250402120000_memberships_audit')) AS m(n, name);
INSERT INTO countries VALUES ('DE', 'Germany'), ('FR', 'France'), ('JP', 'Japan');
INSERT INTO plans (name, price_cents) VALUES ('free', 0), ('team', 900), ('business', 2900);
INSERT INTO users (email, name, plan_id, country)
SELECT 'u' || u || '@example.com', 'User ' || u, 1 + u % 3, (ARRAY['DE', 'FR', 'JP', NULL])[1 + u % 4]
  FROM generate_series(1, :users) AS u;
INSERT INTO projects (user_id, name) SELECT id, 'Project ' || id || '.' || p
  FROM users, generate_series(1, 2) AS p;
INSERT INTO tasks (project_id, title, body, status)
SELECT p.id, 'Task ' || p.id || '.' || t,
       CASE WHEN t = 3 THEN (SELECT string_agg(md5(p.id::text || g), '') FROM generate_series(1, 250) AS g) END,
       (ARRAY['TODO', 'DOING', 'DONE']::"TaskStatus"[])[1 + t % 3]
  FROM projects AS p, generate_series(1, 3) AS t;
INSERT INTO task_labels SELECT id, l FROM tasks, unnest(ARRAY['bug', 'ui']) AS l WHERE id % 3 = 0;
INSERT INTO memberships (user_id, project_id) SELECT 1 + (id * 5) % :users, id FROM projects;
INSERT INTO "AuditLog" ("userId", action) SELECT id, 'signup' FROM users;
ANALYZE;
