CREATE OR REPLACE FUNCTION follows_counters() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE users SET follower_count = follower_count + 1 WHERE id = NEW.followee_id;
        UPDATE users SET following_count = following_count + 1 WHERE id = NEW.follower_id;
        RETURN NEW;
    END IF;
    UPDATE users SET follower_count = follower_count - 1 WHERE id = OLD.followee_id;
    UPDATE users SET following_count = following_count - 1 WHERE id = OLD.follower_id;
    RETURN OLD;
END
$$;

CREATE TRIGGER follows_counters
    AFTER INSERT OR DELETE ON follows
    FOR EACH ROW EXECUTE FUNCTION follows_counters();
