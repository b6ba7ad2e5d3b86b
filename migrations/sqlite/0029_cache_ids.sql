-- The response cache's rows get an id that never comes back (`AUTOINCREMENT`). Replicas
-- follow new rows by it (`cache::refresh` reads rows past the highest it saw); a plain
-- rowid is the highest + 1, so once the newest row was deleted (a 1-second TTL entry
-- evicted) the next row took its rowid again and every other replica passed over it: a
-- key stored again kept its old answer in their memory, a new key was missing there,
-- until their next rebuild (s28 stop attack F2). PostgreSQL's identity never went back.
--
-- The table starts again empty rather than copied: it is a cache, and copying it (up to
-- `max_entries` whole answers, a gigabyte) in the migration's one write transaction held
-- the write lock from a previous version still running on the file during a rolling
-- upgrade past its busy timeout. The epoch bump makes every replica, of either version,
-- drop what it holds in memory and rebuild from the (empty) table at its next poll, so
-- none follows the new ids from a high-water mark of the old ones.
DROP TABLE cache_entries;
CREATE TABLE cache_entries (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    key           BLOB    NOT NULL UNIQUE,
    scope         TEXT    NOT NULL,
    model         TEXT    NOT NULL,
    format        TEXT    NOT NULL,
    context_hash  BLOB,
    vector        BLOB,
    answer        TEXT    NOT NULL,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    tags          TEXT    NOT NULL DEFAULT ',',
    created_at    TEXT    NOT NULL,
    expires_at    TEXT    NOT NULL,
    hits          INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX cache_entries_expiry ON cache_entries(expires_at);
CREATE INDEX cache_entries_context ON cache_entries(context_hash);
UPDATE meta SET value = value + 1 WHERE key = 'cache_epoch';
