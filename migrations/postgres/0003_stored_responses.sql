-- Stored responses of the Responses API: see migrations/sqlite/0014_stored_responses.sql.
CREATE TABLE stored_responses (
    id          TEXT COLLATE "C" PRIMARY KEY,
    token_id    BIGINT           NOT NULL,
    created_at  TEXT COLLATE "C" NOT NULL,
    input       TEXT             NOT NULL,
    response    TEXT             NOT NULL
);
CREATE INDEX stored_responses_time ON stored_responses(created_at);
