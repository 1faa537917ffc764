-- AlterTable
ALTER TABLE "User" ADD COLUMN     "phone" TEXT;
