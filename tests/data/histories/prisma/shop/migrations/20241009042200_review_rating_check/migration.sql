-- Custom migration
ALTER TABLE "Review" ADD CONSTRAINT "Review_rating_check" CHECK ("rating" BETWEEN 1 AND 5) NOT VALID;
ALTER TABLE "Review" VALIDATE CONSTRAINT "Review_rating_check";
