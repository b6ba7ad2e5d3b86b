-- One row per logical request (however many upstream attempts it took). Never a prompt,
-- a completion or a credential.
CREATE TABLE requests (
    id             TEXT    PRIMARY KEY,          -- the x-request-id
    token_id       INTEGER,
    user_id        INTEGER,
    team_id        INTEGER,
    endpoint       TEXT    NOT NULL,
    model          TEXT    NOT NULL DEFAULT '',  -- as asked
    served_model   TEXT    NOT NULL DEFAULT '',  -- the model that answered (after fallback)
    upstream       TEXT    NOT NULL DEFAULT '',
    status         INTEGER NOT NULL,
    error_code     TEXT,
    stream         INTEGER NOT NULL DEFAULT 0,
    attempts       INTEGER NOT NULL DEFAULT 0,
    input_tokens   INTEGER NOT NULL DEFAULT 0,
    output_tokens  INTEGER NOT NULL DEFAULT 0,
    cost_micros    INTEGER NOT NULL DEFAULT 0,
    latency_ms     INTEGER NOT NULL DEFAULT 0,
    ttfb_ms        INTEGER,
    cache          TEXT    NOT NULL DEFAULT 'off',
    created_at     TEXT    NOT NULL
);
CREATE INDEX requests_token_time ON requests(token_id, created_at);
CREATE INDEX requests_time ON requests(created_at);
