-- Custom migration: keep "updatedAt" right for writers other than Prisma Client.
CREATE OR REPLACE FUNCTION "set_updated_at"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW."updatedAt" := CURRENT_TIMESTAMP;
    RETURN NEW;
END
$$;

CREATE TRIGGER "User_set_updated_at" BEFORE UPDATE ON "User"
    FOR EACH ROW EXECUTE FUNCTION "set_updated_at"();
CREATE TRIGGER "Product_set_updated_at" BEFORE UPDATE ON "Product"
    FOR EACH ROW EXECUTE FUNCTION "set_updated_at"();
CREATE TRIGGER "Order_set_updated_at" BEFORE UPDATE ON "Order"
    FOR EACH ROW EXECUTE FUNCTION "set_updated_at"();
