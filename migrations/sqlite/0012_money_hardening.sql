-- Reservations settled as orphans (their owner looked gone: stale heartbeat, dead pid, or a
-- lease past its deadline). An owner that was only stalled (SIGSTOP, a frozen container, a
-- disk stall) settles later: its settlement finds the row here and corrects the orphan's
-- full charge to the actual cost, so the ledger and the request log agree. Rows older than
-- a day are forgotten by the housekeeping.
CREATE TABLE orphaned (
    request_id     TEXT    PRIMARY KEY,
    token_id       INTEGER NOT NULL,
    user_id        INTEGER NOT NULL,
    team_id        INTEGER NOT NULL,
    period         TEXT    NOT NULL,
    user_period    TEXT    NOT NULL,
    team_period    TEXT    NOT NULL,
    amount_micros  INTEGER NOT NULL,
    owner          TEXT    NOT NULL,
    created_at     TEXT    NOT NULL
) WITHOUT ROWID;

-- The start time of a process (clock ticks since boot, /proc/<pid>/stat), so that a pid
-- reused by another program after a crash is not taken for the gateway that held it.
ALTER TABLE processes ADD COLUMN pid_start INTEGER;
