-- Custom migration: a movement changes the product's stock in the same transaction.
CREATE OR REPLACE FUNCTION "apply_stock_movement"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE "Product" SET "stock" = "stock" + NEW."delta" WHERE "id" = NEW."productId";
    RETURN NEW;
END
$$;

CREATE TRIGGER "StockMovement_apply" AFTER INSERT ON "StockMovement"
    FOR EACH ROW EXECUTE FUNCTION "apply_stock_movement"();
