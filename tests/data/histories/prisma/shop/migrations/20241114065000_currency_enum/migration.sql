-- Custom migration: "currency" becomes an enum; the type check looks in this shard's schema only.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE t.typname = 'Currency' AND n.nspname = current_schema()
    ) THEN
        CREATE TYPE "Currency" AS ENUM ('USD', 'EUR', 'GBP');
    END IF;
END
$$;

ALTER TABLE "Product" ALTER COLUMN "currency" DROP DEFAULT;
ALTER TABLE "Product" ALTER COLUMN "currency" TYPE "Currency" USING "currency"::"Currency";
ALTER TABLE "Product" ALTER COLUMN "currency" SET DEFAULT 'USD';
