DROP TABLE IF EXISTS reserved_usernames;
