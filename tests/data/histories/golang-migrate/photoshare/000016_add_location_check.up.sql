ALTER TABLE photos
    ADD CONSTRAINT photos_location_pair CHECK ((latitude IS NULL) = (longitude IS NULL)) NOT VALID;
