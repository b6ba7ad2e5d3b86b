-- Stored responses of the Responses API (`store`, `previous_response_id`; issue 18): the
-- gateway keeps them itself, so any upstream and key can continue a conversation. A row is
-- the conversation up to and including one response — customer data (see the threat model
-- in docs/DESIGN.md) — visible only to the token that made it, and swept after
-- `[responses] retention_days`.
CREATE TABLE stored_responses (
    id          TEXT PRIMARY KEY,
    token_id    INTEGER NOT NULL,
    created_at  TEXT    NOT NULL,
    -- JSON array: every input item of the conversation up to this response (earlier
    -- responses' input and output items included).
    input       TEXT    NOT NULL,
    -- JSON: the response object as the client received it.
    response    TEXT    NOT NULL
);
CREATE INDEX stored_responses_time ON stored_responses(created_at);
