DROP TRIGGER IF EXISTS users_set_updated_at ON users;
