DROP VIEW IF EXISTS photo_feed;
