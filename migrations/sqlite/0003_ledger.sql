-- The money ledger: append-only. Positive amounts consume budget, negative ones return it.
-- Each row carries the budget period of every level it touches, so each level's invariant
--   limit - remaining == SUM(amount) over kinds reserve/settle/adjust in its current period
-- can be checked on its own. `absorbed` rows (actual cost above the reservation) and
-- `orphan` rows (0, for the record) are excluded from that sum.
CREATE TABLE ledger (
    id             INTEGER PRIMARY KEY,
    token_id       INTEGER,
    user_id        INTEGER,
    team_id        INTEGER,
    period         TEXT    NOT NULL,   -- the token's period
    user_period    TEXT    NOT NULL,
    team_period    TEXT    NOT NULL,
    kind           TEXT    NOT NULL CHECK (kind IN ('reserve', 'settle', 'adjust', 'orphan', 'absorbed')),
    amount_micros  INTEGER NOT NULL,
    request_id     TEXT,
    reason         TEXT,
    created_at     TEXT    NOT NULL
);
CREATE INDEX ledger_token_period ON ledger(token_id, period);
CREATE INDEX ledger_user_period ON ledger(user_id, user_period);
CREATE INDEX ledger_team_period ON ledger(team_id, team_period);
CREATE INDEX ledger_request ON ledger(request_id);

CREATE TRIGGER ledger_no_update BEFORE UPDATE ON ledger
BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END;
CREATE TRIGGER ledger_no_delete BEFORE DELETE ON ledger
BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END;

-- In-flight reservations. A row lives from reserve to settle; rows whose owner process is
-- gone are settled at their full amount at the next start (kind `orphan`).
CREATE TABLE reservations (
    request_id     TEXT    PRIMARY KEY,
    token_id       INTEGER NOT NULL,
    user_id        INTEGER NOT NULL,
    team_id        INTEGER NOT NULL,
    period         TEXT    NOT NULL,
    user_period    TEXT    NOT NULL,
    team_period    TEXT    NOT NULL,
    amount_micros  INTEGER NOT NULL,
    owner          TEXT    NOT NULL,
    deadline       TEXT    NOT NULL,
    created_at     TEXT    NOT NULL
);
CREATE INDEX reservations_owner ON reservations(owner);

-- Gateway processes sharing this database, with a heartbeat, so a restart can tell a
-- crashed owner's reservations from a live neighbour's.
CREATE TABLE processes (
    id            TEXT    PRIMARY KEY,
    host          TEXT    NOT NULL,
    pid           INTEGER NOT NULL,
    started_at    TEXT    NOT NULL,
    heartbeat_at  TEXT    NOT NULL
);
