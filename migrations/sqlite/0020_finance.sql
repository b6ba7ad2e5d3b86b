-- Reconciliation against the provider's bill (`sluice reconcile`, `src/finance/`).
--
-- The model name the upstream was sent (a route's `model`, on Azure its deployment name):
-- the provider bills under that name, not under the name the client asked for. Rows
-- logged before this column existed keep '' (reports then fall back to `served_model`).
ALTER TABLE requests ADD COLUMN upstream_model TEXT NOT NULL DEFAULT '';

-- One run of `sluice reconcile`: which provider's export, when, under which thresholds.
CREATE TABLE reconciliations (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    provider             TEXT    NOT NULL,          -- openai | anthropic
    source               TEXT    NOT NULL,          -- the export's file name (no folder)
    first_day            TEXT    NOT NULL,          -- YYYY-MM-DD, UTC, inclusive
    last_day             TEXT    NOT NULL,
    threshold_micros     INTEGER NOT NULL,
    threshold_pct_bp     INTEGER NOT NULL,          -- basis points: 200 = 2 %
    sluice_micros        INTEGER NOT NULL,
    provider_micros      INTEGER NOT NULL,
    flagged              INTEGER NOT NULL,          -- how many rows are flagged
    created_at           TEXT    NOT NULL
);

-- One (day, model, account) of a run: Sluice's spend next to the provider's figure.
CREATE TABLE reconciliation_rows (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id           INTEGER NOT NULL REFERENCES reconciliations(id),
    day              TEXT    NOT NULL,
    model            TEXT    NOT NULL,
    account          TEXT    NOT NULL,              -- a provider account, or '*'
    sluice_micros    INTEGER NOT NULL,
    provider_micros  INTEGER NOT NULL,
    diff_micros      INTEGER NOT NULL,              -- sluice − provider
    flagged          INTEGER NOT NULL
);
CREATE INDEX reconciliation_rows_run ON reconciliation_rows(run_id);

-- Alerts finance sends at most once per subject and day (the digest: per team and ISO
-- week) across every replica (`budget_exhaustion_forecast`, `weekly_digest`): the first
-- replica to insert the row sends it.
CREATE TABLE finance_notices (
    kind        TEXT NOT NULL,
    subject     TEXT NOT NULL,                      -- token:ID, user:ID, team:ID
    day         TEXT NOT NULL,                      -- YYYY-MM-DD (UTC); the digest: YYYY-Www
    created_at  TEXT NOT NULL,
    PRIMARY KEY (kind, subject, day)
);
