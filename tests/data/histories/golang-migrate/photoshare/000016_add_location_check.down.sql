ALTER TABLE photos DROP CONSTRAINT IF EXISTS photos_location_pair;
