DROP TYPE IF EXISTS account_status;
