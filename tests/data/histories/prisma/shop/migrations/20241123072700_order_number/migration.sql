-- Custom migration: human-facing order numbers, per shard.
CREATE SEQUENCE "order_number_seq";
ALTER TABLE "Order" ADD COLUMN "number" INTEGER NOT NULL DEFAULT nextval('order_number_seq');
