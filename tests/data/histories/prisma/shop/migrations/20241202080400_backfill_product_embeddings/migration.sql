-- Custom migration (data)
UPDATE "Product" SET "embedding" = '[0,0,0,1]' WHERE "embedding" IS NULL;
