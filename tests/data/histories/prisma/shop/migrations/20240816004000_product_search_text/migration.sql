-- AlterTable
ALTER TABLE "Product" ADD COLUMN     "searchText" TEXT GENERATED ALWAYS AS (lower("name" || ' ' || coalesce("description", ''))) STORED;
