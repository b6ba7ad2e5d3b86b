-- Which store of its key a row holds, drawn at random per store (`store::cache::NewEntry`):
-- a replica's refresh popped every key stored since its last one from memory, its own
-- new answers too, and read each from the table again at its next use; with the version
-- it keeps the very entry it holds. 0: a row stored before, never taken for one held.
ALTER TABLE cache_entries ADD COLUMN version BIGINT NOT NULL DEFAULT 0;

-- An older Sluice still running in the fleet stores a key again with an upsert that sets
-- every column but this one (`id = DEFAULT` among them): the row would keep the version
-- of the store it replaced, and a replica holding that store would keep serving it (s39
-- attack F1). A store that leaves the version as it was is marked unversioned. Only an
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
