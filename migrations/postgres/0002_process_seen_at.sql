-- Liveness by the database's clock (issue 17): `seen_at` is when the database received a
-- process's latest heartbeat, by its own clock (`clock_timestamp()`), and the dead check
-- compares it with that same clock. `heartbeat_at` (the process's own clock) stays: a
-- lease is expired when it is older than its owner's beat, both by the owner's clock. A
-- host whose clock runs ahead no longer takes every other live host for dead. Kept as
-- TIMESTAMPTZ (not the fixed-width text of the other times): only SQL reads it.
--
-- Stamped by a trigger on every write of `heartbeat_at`, not by the heartbeat statement:
-- during a rolling upgrade a host still running the previous version beats with its old
-- statement, and must not be taken for dead by the new ones.
ALTER TABLE processes ADD COLUMN seen_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp();

CREATE FUNCTION processes_seen_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.seen_at := clock_timestamp();
    RETURN NEW;
END
$$;

CREATE TRIGGER processes_seen_at BEFORE INSERT OR UPDATE OF heartbeat_at ON processes
    FOR EACH ROW EXECUTE FUNCTION processes_seen_at();
