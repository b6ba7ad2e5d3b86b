-- Fewer database pages per money transaction (issue 10: every reserve and settle commit
-- writes each page it touched to the WAL, and those page writes were most of the store
-- writer's CPU).
--
-- `reservations` holds only in-flight reservations, so it needs no secondary index: the
-- owner lookups (orphan recovery, shutdown) scan it. Keyed WITHOUT ROWID by its request id,
-- a reservation's insert and delete touch one b-tree instead of three (table, primary-key
-- index, owner index).
CREATE TABLE reservations_by_request (
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
) WITHOUT ROWID;
INSERT INTO reservations_by_request SELECT request_id, token_id, user_id, team_id, period,
    user_period, team_period, amount_micros, owner, deadline, created_at FROM reservations;
DROP TABLE reservations;
ALTER TABLE reservations_by_request RENAME TO reservations;

-- Nothing in the product looks ledger rows up by request id (a request's cost is in the
-- request log); the index cost one more page per ledger row.
DROP INDEX ledger_request;
