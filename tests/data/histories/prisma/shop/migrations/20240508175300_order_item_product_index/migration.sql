-- CreateIndex
CREATE INDEX "OrderItem_productId_idx" ON "OrderItem"("productId");
