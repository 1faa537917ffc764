-- Custom migration
CREATE VIEW "ProductRating" AS
SELECT p."id" AS "productId", count(r."id") AS "reviews", avg(r."rating")::numeric(3,2) AS "average"
  FROM "Product" p LEFT JOIN "Review" r ON r."productId" = p."id"
 GROUP BY p."id";
