DROP TYPE IF EXISTS media_kind;
