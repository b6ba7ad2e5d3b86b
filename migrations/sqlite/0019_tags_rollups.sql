-- Attribution tags (issue 20): a request's tags as canonical text (`key:value` pairs
-- sorted by key, joined by `,`; empty for none: `pipeline::tags`), and the default tags
-- of a token and of a team, merged under a request's own.
ALTER TABLE requests ADD COLUMN tags TEXT NOT NULL DEFAULT '';
ALTER TABLE tokens ADD COLUMN tags TEXT NOT NULL DEFAULT '';
ALTER TABLE teams ADD COLUMN tags TEXT NOT NULL DEFAULT '';

-- Spend per UTC day and every report dimension, added to in the transaction that writes
-- the request-log rows (`store::requests`), so a report over whole days reads this table
-- and never `requests`. Only authenticated requests (a token) are counted, as reports
-- count them. `tags` is the request's whole canonical tag text: a report by tag key or
-- filtered by a tag parses it (`store::spend`).
CREATE TABLE spend_days (
    day           TEXT    NOT NULL,            -- substr(created_at, 1, 10), UTC
    team_id       INTEGER NOT NULL,
    user_id       INTEGER NOT NULL,
    token_id      INTEGER NOT NULL,
    model         TEXT    NOT NULL,            -- as asked
    served_model  TEXT    NOT NULL,            -- as served ('' when nothing answered)
    upstream      TEXT    NOT NULL,
    tags          TEXT    NOT NULL,
    requests      INTEGER NOT NULL,
    errors        INTEGER NOT NULL,            -- status outside 200..299
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cost_micros   INTEGER NOT NULL,
    PRIMARY KEY (day, team_id, user_id, token_id, model, served_model, upstream, tags)
) WITHOUT ROWID;
CREATE INDEX spend_days_team ON spend_days(team_id, day);

INSERT INTO spend_days (day, team_id, user_id, token_id, model, served_model, upstream, tags,
                        requests, errors, input_tokens, output_tokens, cost_micros)
SELECT substr(created_at, 1, 10), COALESCE(team_id, 0), COALESCE(user_id, 0), token_id, model, served_model,
       upstream, tags, COUNT(*), SUM(status NOT BETWEEN 200 AND 299), SUM(input_tokens), SUM(output_tokens),
       SUM(cost_micros)
FROM requests WHERE token_id IS NOT NULL GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;
