CREATE TABLE photo_hashtags (
    photo_id    bigint NOT NULL REFERENCES photos (id) ON DELETE CASCADE,
    hashtag_id  bigint NOT NULL REFERENCES hashtags (id) ON DELETE CASCADE,
    PRIMARY KEY (hashtag_id, photo_id)
);
