-- Admin web sessions. Only the SHA-256 of a session id is stored (hex), never the id, so a
-- copy of the database cannot be replayed as a cookie; replicas sharing the file share them.
CREATE TABLE admin_sessions (
    id_hash       TEXT    PRIMARY KEY,
    admin_id      INTEGER NOT NULL REFERENCES admins(id),
    address       TEXT    NOT NULL DEFAULT '',
    created_at    TEXT    NOT NULL,
    last_seen_at  TEXT    NOT NULL
);
CREATE INDEX admin_sessions_admin ON admin_sessions(admin_id);

-- Admin API keys (`sk-sl-admin-…`), created in the UI; they act with their owner's role.
CREATE TABLE admin_api_keys (
    id            INTEGER PRIMARY KEY,
    admin_id      INTEGER NOT NULL REFERENCES admins(id),
    key_hash      BLOB    NOT NULL UNIQUE,
    prefix        TEXT    NOT NULL,
    name          TEXT    NOT NULL DEFAULT '',
    created_at    TEXT    NOT NULL,
    revoked_at    TEXT
);
CREATE INDEX admin_api_keys_admin ON admin_api_keys(admin_id);

-- Failed logins, per `user:<name>` and per `addr:<ip>`, for throttling across replicas.
CREATE TABLE login_failures (
    key  TEXT NOT NULL,
    at   TEXT NOT NULL
);
CREATE INDEX login_failures_key_at ON login_failures(key, at);

-- A disabled login cannot sign in; its sessions and API keys stop working at once.
ALTER TABLE admins ADD COLUMN disabled INTEGER NOT NULL DEFAULT 0;
