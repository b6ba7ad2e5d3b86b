-- Tenancy and sub-tokens. Budgets live at three levels (team, user, token), each with the
-- same columns: limit_micros NULL means "no limit at this level"; remaining_micros is what
-- the quota CAS decrements; reserved_micros is what in-flight requests hold; `period` names
-- the budget period the remaining amount belongs to (see src/quota/period.rs).
CREATE TABLE teams (
    id               INTEGER PRIMARY KEY,
    name             TEXT    NOT NULL UNIQUE,
    limit_micros     INTEGER,
    remaining_micros INTEGER,
    reserved_micros  INTEGER NOT NULL DEFAULT 0,
    reset            TEXT    NOT NULL DEFAULT 'monthly',
    period           TEXT    NOT NULL DEFAULT '',
    created_at       TEXT    NOT NULL
);

CREATE TABLE users (
    id               INTEGER PRIMARY KEY,
    username         TEXT    NOT NULL UNIQUE,
    team_id          INTEGER NOT NULL REFERENCES teams(id),
    disabled         INTEGER NOT NULL DEFAULT 0,
    rpm              INTEGER,
    tpm              INTEGER,
    limit_micros     INTEGER,
    remaining_micros INTEGER,
    reserved_micros  INTEGER NOT NULL DEFAULT 0,
    reset            TEXT    NOT NULL DEFAULT 'monthly',
    period           TEXT    NOT NULL DEFAULT '',
    created_at       TEXT    NOT NULL
);

CREATE TABLE tokens (
    id                INTEGER PRIMARY KEY,
    user_id           INTEGER NOT NULL REFERENCES users(id),
    token_hash        BLOB    NOT NULL UNIQUE,   -- SHA-256 of the token text; the text is never stored
    prefix            TEXT    NOT NULL,          -- 8 characters after `sk-sl-`, for display
    name              TEXT    NOT NULL DEFAULT '',
    models            TEXT,                      -- JSON array of allowed model names; NULL = all
    rpm               INTEGER,
    tpm               INTEGER,
    max_priority      INTEGER NOT NULL DEFAULT 2,
    downgrade_model   TEXT,
    alert_percent     INTEGER NOT NULL DEFAULT 80,
    limit_micros      INTEGER,
    remaining_micros  INTEGER,
    reserved_micros   INTEGER NOT NULL DEFAULT 0,
    reset             TEXT    NOT NULL DEFAULT 'never',
    period            TEXT    NOT NULL DEFAULT '',
    expires_at        TEXT,
    revoked_at        TEXT,
    created_at        TEXT    NOT NULL,
    last_used_at      TEXT
);
CREATE INDEX tokens_user ON tokens(user_id);

-- Change counters that replicas poll (at least once a second) to drop cached credentials.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO meta(key, value) VALUES ('token_epoch', 0);
