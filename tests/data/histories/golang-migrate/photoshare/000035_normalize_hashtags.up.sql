-- Data migration: hashtags were stored as typed.
UPDATE hashtags SET name = lower(name) WHERE name <> lower(name);
