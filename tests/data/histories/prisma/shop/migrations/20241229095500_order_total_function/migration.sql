-- Custom migration: bound to this shard's tables when created (SQL-standard body).
CREATE FUNCTION "order_total"(order_id TEXT) RETURNS INTEGER
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT coalesce(sum("quantity" * "unitPriceCents"), 0)::integer FROM "OrderItem" WHERE "orderId" = order_id;
END;
