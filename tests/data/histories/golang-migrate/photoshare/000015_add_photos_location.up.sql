ALTER TABLE photos
    ADD COLUMN latitude double precision,
    ADD COLUMN longitude double precision;
