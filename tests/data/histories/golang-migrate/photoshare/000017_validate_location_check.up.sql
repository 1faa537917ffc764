ALTER TABLE photos VALIDATE CONSTRAINT photos_location_pair;
