-- Custom migration: the rename ran by hand on some environments; the check stays in this shard's schema.
DO $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = 'Product' AND column_name = 'priceCents'
    ) THEN
        ALTER TABLE "Product" RENAME COLUMN "priceCents" TO "unitPriceCents";
    END IF;
END
$$;
