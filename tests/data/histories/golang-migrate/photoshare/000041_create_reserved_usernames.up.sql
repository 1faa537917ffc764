CREATE TABLE reserved_usernames (name text PRIMARY KEY);
INSERT INTO reserved_usernames (name) VALUES ('admin'), ('support'), ('help'), ('root')
ON CONFLICT (name) DO NOTHING;
