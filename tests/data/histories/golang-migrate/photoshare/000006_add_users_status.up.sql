ALTER TABLE users ADD COLUMN status account_status NOT NULL DEFAULT 'active';
