-- Custom migration (data)
INSERT INTO "Category" ("id", "name") VALUES
    ('cat_books', 'Books'), ('cat_games', 'Games'), ('cat_music', 'Music')
ON CONFLICT ("name") DO NOTHING;
