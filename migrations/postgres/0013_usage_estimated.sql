-- Whether a request's usage was estimated, and the estimated spend in the rollups (see
-- migrations/sqlite/0024_usage_estimated.sql).
ALTER TABLE requests ADD COLUMN usage_estimated BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE requests SET usage_estimated = TRUE WHERE error_code = 'usage_estimated';

ALTER TABLE spend_days ADD COLUMN estimated_micros BIGINT NOT NULL DEFAULT 0;
ALTER TABLE spend_months ADD COLUMN estimated_micros BIGINT NOT NULL DEFAULT 0;

-- The trigger that follows other writers of `spend_days` (0012_spend_months.sql) carries
-- the new column: the same function, with `estimated_micros` beside `cost_micros`.
CREATE OR REPLACE FUNCTION spend_months_add(d spend_days, sign BIGINT) RETURNS void LANGUAGE sql AS $$
    INSERT INTO spend_months AS m (month, team_id, user_id, token_id, model, served_model, upstream, tags,
                                   requests, errors, input_tokens, output_tokens, cost_micros, estimated_micros)
    VALUES (substr(d.day, 1, 7), d.team_id, d.user_id, d.token_id, d.model, d.served_model, d.upstream, d.tags,
            sign * d.requests, sign * d.errors, sign * d.input_tokens, sign * d.output_tokens, sign * d.cost_micros,
            sign * d.estimated_micros)
    ON CONFLICT (month, team_id, user_id, token_id, model, served_model, upstream, tags) DO UPDATE SET
        requests = m.requests + EXCLUDED.requests, errors = m.errors + EXCLUDED.errors,
        input_tokens = m.input_tokens + EXCLUDED.input_tokens,
        output_tokens = m.output_tokens + EXCLUDED.output_tokens,
        cost_micros = m.cost_micros + EXCLUDED.cost_micros,
        estimated_micros = m.estimated_micros + EXCLUDED.estimated_micros;
    DELETE FROM spend_months
    WHERE month = substr(d.day, 1, 7) AND team_id = d.team_id AND user_id = d.user_id AND token_id = d.token_id
      AND model = d.model AND served_model = d.served_model AND upstream = d.upstream AND tags = d.tags
      AND requests = 0;
$$;

-- The days rolled up before, as on SQLite (a lower bound); the trigger adds the same to
-- the months (this migration's transaction is not marked as writing them).
UPDATE spend_days s SET estimated_micros = LEAST(e.micros, s.cost_micros)
FROM (SELECT substr(created_at, 1, 10) AS day, COALESCE(team_id, 0) AS team_id, COALESCE(user_id, 0) AS user_id,
             token_id, model, served_model, upstream, tags, SUM(cost_micros) AS micros
      FROM requests WHERE usage_estimated AND token_id IS NOT NULL
      GROUP BY 1, 2, 3, 4, 5, 6, 7, 8) AS e
WHERE s.day = e.day AND s.team_id = e.team_id AND s.user_id = e.user_id AND s.token_id = e.token_id
  AND s.model = e.model AND s.served_model = e.served_model AND s.upstream = e.upstream AND s.tags = e.tags;
