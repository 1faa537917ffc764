ALTER TABLE photos DROP COLUMN latitude, DROP COLUMN longitude;
