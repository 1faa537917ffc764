-- Custom migration (data): totals of orders placed before the column existed.
UPDATE "Order" o
   SET "totalCents" = s."total"
  FROM (SELECT "orderId", sum("quantity" * "unitPriceCents")::integer AS "total"
          FROM "OrderItem" GROUP BY "orderId") s
 WHERE s."orderId" = o."id";
