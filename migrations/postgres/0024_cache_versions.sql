-- Which store of its key a row holds, drawn at random per store (`store::cache::NewEntry`):
-- a replica's refresh popped every key stored since its last one from memory, its own
-- new answers too, and read each from the table again at its next use; with the version
-- it keeps the very entry it holds. 0: a row stored before, never taken for one held.
ALTER TABLE cache_entries ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
