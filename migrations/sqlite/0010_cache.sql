-- The response cache, shared by replicas on one database. An entry is a whole answer in
-- the client's wire format; `context_hash` groups entries whose requests differ at most in
-- their last user message, and `vector` is that message's embedding (little-endian f32),
-- so the semantic index can be rebuilt at start. `tags` is `,a,b,` for LIKE matching.
CREATE TABLE cache_entries (
    key           BLOB    PRIMARY KEY,
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

ALTER TABLE tokens ADD COLUMN cache_ttl_seconds INTEGER;
ALTER TABLE requests ADD COLUMN cache_key TEXT;
ALTER TABLE requests ADD COLUMN cache_similarity REAL;
INSERT INTO meta(key, value) VALUES ('cache_epoch', 0);
