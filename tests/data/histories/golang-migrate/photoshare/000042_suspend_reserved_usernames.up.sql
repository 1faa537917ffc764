-- Data migration: accounts that took a reserved name before the list existed.
UPDATE users SET status = 'suspended'
 WHERE lower(username) IN (SELECT name FROM reserved_usernames) AND status = 'active';
