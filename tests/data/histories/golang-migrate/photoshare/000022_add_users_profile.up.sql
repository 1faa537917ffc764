ALTER TABLE users
    ADD COLUMN bio text,
    ADD COLUMN website text;
