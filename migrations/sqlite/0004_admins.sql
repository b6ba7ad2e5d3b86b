-- People who log in to the admin surface. Members who only hold sub-tokens have no row here.
CREATE TABLE admins (
    id             INTEGER PRIMARY KEY,
    username       TEXT    NOT NULL UNIQUE,
    password_hash  TEXT    NOT NULL,            -- argon2id PHC string
    role           TEXT    NOT NULL CHECK (role IN ('admin', 'lead', 'finance')),
    team_id        INTEGER REFERENCES teams(id),
    created_at     TEXT    NOT NULL
);

-- Who changed what, from where. Append-only and hash-chained: each row's hash covers the
-- previous row's hash, so an edited row breaks the chain from that row on.
CREATE TABLE audit_log (
    id          INTEGER PRIMARY KEY,
    actor       TEXT    NOT NULL,
    address     TEXT    NOT NULL DEFAULT '',
    action      TEXT    NOT NULL,
    target      TEXT    NOT NULL DEFAULT '',
    before      TEXT,
    after       TEXT,
    created_at  TEXT    NOT NULL,
    prev_hash   TEXT    NOT NULL,
    hash        TEXT    NOT NULL
);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit_log
BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit_log
BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;
