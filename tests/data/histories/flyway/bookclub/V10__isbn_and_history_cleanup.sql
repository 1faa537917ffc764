ALTER TABLE books ADD COLUMN isbn text;
ALTER TABLE books ADD CONSTRAINT books_isbn_format CHECK (isbn ~ '^[0-9]{9}[0-9X]$|^[0-9]{13}$');

-- V3 was renamed in the repository; keep Flyway's history readable.
UPDATE flyway_schema_history SET description = 'create books' WHERE version = '3';
