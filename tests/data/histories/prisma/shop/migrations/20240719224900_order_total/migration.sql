-- AlterTable
ALTER TABLE "Order" ADD COLUMN     "totalCents" INTEGER NOT NULL DEFAULT 0;
