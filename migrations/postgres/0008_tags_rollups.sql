-- Attribution tags and the spend rollup (see migrations/sqlite/0019_tags_rollups.sql).
ALTER TABLE requests ADD COLUMN tags TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE tokens ADD COLUMN tags TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE teams ADD COLUMN tags TEXT COLLATE "C" NOT NULL DEFAULT '';

CREATE TABLE spend_days (
    day           TEXT COLLATE "C" NOT NULL,
    team_id       BIGINT NOT NULL,
    user_id       BIGINT NOT NULL,
    token_id      BIGINT NOT NULL,
    model         TEXT COLLATE "C" NOT NULL,
    served_model  TEXT COLLATE "C" NOT NULL,
    upstream      TEXT COLLATE "C" NOT NULL,
    tags          TEXT COLLATE "C" NOT NULL,
    requests      BIGINT NOT NULL,
    errors        BIGINT NOT NULL,
    input_tokens  BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cost_micros   BIGINT NOT NULL,
    PRIMARY KEY (day, team_id, user_id, token_id, model, served_model, upstream, tags)
);
CREATE INDEX spend_days_team ON spend_days(team_id, day);

INSERT INTO spend_days (day, team_id, user_id, token_id, model, served_model, upstream, tags,
                        requests, errors, input_tokens, output_tokens, cost_micros)
SELECT substr(created_at, 1, 10), COALESCE(team_id, 0), COALESCE(user_id, 0), token_id, model, served_model,
       upstream, tags, COUNT(*), COUNT(*) FILTER (WHERE status NOT BETWEEN 200 AND 299), SUM(input_tokens),
       SUM(output_tokens), SUM(cost_micros)
FROM requests WHERE token_id IS NOT NULL GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;
