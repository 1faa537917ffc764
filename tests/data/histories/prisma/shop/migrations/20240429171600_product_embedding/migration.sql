-- AlterTable
ALTER TABLE "Product" ADD COLUMN     "embedding" vector(4);
