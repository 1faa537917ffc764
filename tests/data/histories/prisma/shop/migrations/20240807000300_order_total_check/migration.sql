-- Custom migration
ALTER TABLE "Order" ADD CONSTRAINT "Order_totalCents_check" CHECK ("totalCents" >= 0);
