-- An older Sluice still running in the fleet stores a key again with an upsert that sets
-- every column but `version` (0024) (`id = DEFAULT` among them): the row would keep the version
-- of the store it replaced, and a replica holding that store would keep serving it (s39
-- attack F1). A store that leaves the version as it was is marked unversioned (so is
-- a batch of this version's written twice, or a version drawn twice: a read more, no more). Only an
-- upsert sets `id`: a hit's count does not fire it.
CREATE FUNCTION cache_entries_unversioned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.version = OLD.version THEN
        NEW.version := 0;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER cache_entries_unversioned BEFORE UPDATE OF id ON cache_entries
    FOR EACH ROW EXECUTE FUNCTION cache_entries_unversioned();
