-- CreateIndex
CREATE INDEX "Product_searchText_idx" ON "Product"("searchText");
