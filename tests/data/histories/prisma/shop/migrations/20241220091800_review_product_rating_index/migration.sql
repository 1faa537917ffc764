-- CreateIndex
CREATE INDEX "Review_productId_rating_idx" ON "Review"("productId", "rating");
