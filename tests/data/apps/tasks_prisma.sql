-- A task tracker as `prisma migrate` lays it out (our own schema, in the shape Prisma's generated
-- migration.sql files leave): models mapped to snake_case tables with @@map, one model left under
-- its own quoted name ("AuditLog"), BigInt/Int autoincrement IDs (bigserial/serial), an enum, unique
-- fields as separate unique indexes named <table>_<column>_key, composite @@id keys, ON DELETE
-- CASCADE relations, timestamp(3) columns, and Prisma's own _prisma_migrations table.
CREATE TYPE "TaskStatus" AS ENUM ('TODO', 'DOING', 'DONE');

CREATE TABLE "_prisma_migrations" (
    "id" varchar(36) PRIMARY KEY NOT NULL,
    "checksum" varchar(64) NOT NULL,
    "finished_at" timestamp with time zone,
    "migration_name" varchar(255) NOT NULL,
    "logs" text,
    "rolled_back_at" timestamp with time zone,
    "started_at" timestamp with time zone NOT NULL DEFAULT now(),
    "applied_steps_count" integer NOT NULL DEFAULT 0
);

CREATE TABLE "countries" (
    "code" char(2) NOT NULL,
    "name" text NOT NULL,
    CONSTRAINT "countries_pkey" PRIMARY KEY ("code")
);

CREATE TABLE "plans" (
    "id" SERIAL NOT NULL,
    "name" text NOT NULL,
    "price_cents" integer NOT NULL,
    CONSTRAINT "plans_pkey" PRIMARY KEY ("id")
);

CREATE TABLE "users" (
    "id" BIGSERIAL NOT NULL,
    "email" text NOT NULL,
    "name" text,
    "plan_id" integer NOT NULL,
    "country" char(2),
    "created_at" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    CONSTRAINT "users_pkey" PRIMARY KEY ("id")
);
CREATE UNIQUE INDEX "users_email_key" ON "users"("email");

CREATE TABLE "projects" (
    "id" BIGSERIAL NOT NULL,
    "user_id" bigint NOT NULL,
    "name" text NOT NULL,
    "archived" boolean NOT NULL DEFAULT false,
    "created_at" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    CONSTRAINT "projects_pkey" PRIMARY KEY ("id")
);
CREATE INDEX "projects_user_id_idx" ON "projects"("user_id");

CREATE TABLE "tasks" (
    "id" BIGSERIAL NOT NULL,
    "project_id" bigint NOT NULL,
    "title" text NOT NULL,
    "body" text,
    "status" "TaskStatus" NOT NULL DEFAULT 'TODO',
    "due" date,
    "created_at" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    CONSTRAINT "tasks_pkey" PRIMARY KEY ("id")
);
CREATE INDEX "tasks_project_id_status_idx" ON "tasks"("project_id", "status");

CREATE TABLE "task_labels" (
    "task_id" bigint NOT NULL,
    "label" varchar(40) NOT NULL,
    CONSTRAINT "task_labels_pkey" PRIMARY KEY ("task_id", "label")
);

CREATE TABLE "memberships" (
    "user_id" bigint NOT NULL,
    "project_id" bigint NOT NULL,
    "role" text NOT NULL DEFAULT 'member',
    CONSTRAINT "memberships_pkey" PRIMARY KEY ("user_id", "project_id")
);

CREATE TABLE "AuditLog" (
    "id" integer GENERATED ALWAYS AS IDENTITY,
    "userId" bigint,
    "action" text NOT NULL,
    "at" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    CONSTRAINT "AuditLog_pkey" PRIMARY KEY ("id")
);

ALTER TABLE "users" ADD CONSTRAINT "users_plan_id_fkey" FOREIGN KEY ("plan_id") REFERENCES "plans"("id") ON DELETE RESTRICT ON UPDATE CASCADE;
ALTER TABLE "users" ADD CONSTRAINT "users_country_fkey" FOREIGN KEY ("country") REFERENCES "countries"("code") ON DELETE SET NULL ON UPDATE CASCADE;
ALTER TABLE "projects" ADD CONSTRAINT "projects_user_id_fkey" FOREIGN KEY ("user_id") REFERENCES "users"("id") ON DELETE CASCADE ON UPDATE CASCADE;
ALTER TABLE "tasks" ADD CONSTRAINT "tasks_project_id_fkey" FOREIGN KEY ("project_id") REFERENCES "projects"("id") ON DELETE CASCADE ON UPDATE CASCADE;
ALTER TABLE "task_labels" ADD CONSTRAINT "task_labels_task_id_fkey" FOREIGN KEY ("task_id") REFERENCES "tasks"("id") ON DELETE CASCADE ON UPDATE CASCADE;
ALTER TABLE "memberships" ADD CONSTRAINT "memberships_user_id_fkey" FOREIGN KEY ("user_id") REFERENCES "users"("id") ON DELETE CASCADE ON UPDATE CASCADE;
ALTER TABLE "memberships" ADD CONSTRAINT "memberships_project_id_fkey" FOREIGN KEY ("project_id") REFERENCES "projects"("id") ON DELETE CASCADE ON UPDATE CASCADE;
ALTER TABLE "AuditLog" ADD CONSTRAINT "AuditLog_userId_fkey" FOREIGN KEY ("userId") REFERENCES "users"("id") ON DELETE SET NULL ON UPDATE CASCADE;
