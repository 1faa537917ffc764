-- Custom migration (data): emails compare case-insensitively from now on.
UPDATE "User" SET "email" = lower("email") WHERE "email" <> lower("email");
