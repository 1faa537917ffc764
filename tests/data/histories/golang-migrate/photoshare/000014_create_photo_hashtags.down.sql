DROP TABLE IF EXISTS photo_hashtags;
