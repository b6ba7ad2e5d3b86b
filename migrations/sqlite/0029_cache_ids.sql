-- The response cache's rows get an id that never comes back (`AUTOINCREMENT`). Replicas
-- follow new rows by it (`cache::refresh` reads rows past the highest it saw); a plain
-- rowid is the highest + 1, so once the newest row was deleted (a 1-second TTL entry
-- evicted) the next row took its rowid again and every other replica passed over it: a
-- key stored again kept its old answer in their memory, a new key was missing there,
-- until their next rebuild (s28 stop attack F2). PostgreSQL's identity never went back.
--
-- The rowids are kept: a replica of the previous version, still running during a rolling
-- upgrade, follows the same numbers. Its `INSERT OR REPLACE` by key works unchanged.
CREATE TABLE cache_entries_new (
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
INSERT INTO cache_entries_new (id, key, scope, model, format, context_hash, vector, answer,
    input_tokens, output_tokens, tags, created_at, expires_at, hits)
SELECT rowid, key, scope, model, format, context_hash, vector, answer,
    input_tokens, output_tokens, tags, created_at, expires_at, hits
FROM cache_entries;
DROP TABLE cache_entries;
ALTER TABLE cache_entries_new RENAME TO cache_entries;
CREATE INDEX cache_entries_expiry ON cache_entries(expires_at);
CREATE INDEX cache_entries_context ON cache_entries(context_hash);
