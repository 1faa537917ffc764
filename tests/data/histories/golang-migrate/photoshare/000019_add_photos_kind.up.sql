ALTER TABLE photos ADD COLUMN kind media_kind NOT NULL DEFAULT 'photo';
