-- CreateExtension
CREATE EXTENSION IF NOT EXISTS "vector";
