ALTER TABLE users ADD COLUMN website text;
