-- The spend rollup's monthly level (see migrations/sqlite/0023_spend_months.sql).
--
-- This version writes the months itself, in the request-log statement that writes the days
-- (`pg::requests`: upserted in key order after the days, so two hosts' batches lock alike),
-- and marks its transaction (`sluice.spend_months = 'written'`). Every other writer of
-- `spend_days` — the previous version during a rolling upgrade, a hand-made fix — is
-- followed by the trigger below, so the months always equal the sum of their days.
CREATE TABLE spend_months (
    month         TEXT COLLATE "C" NOT NULL,
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
    PRIMARY KEY (month, team_id, user_id, token_id, model, served_model, upstream, tags)
);
CREATE INDEX spend_months_team ON spend_months(team_id, month);

-- `CREATE TRIGGER` below locks `spend_days` against writes until this migration commits,
-- so no day row is written between the backfill and the trigger.
LOCK TABLE spend_days IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO spend_months (month, team_id, user_id, token_id, model, served_model, upstream, tags,
                          requests, errors, input_tokens, output_tokens, cost_micros)
SELECT substr(day, 1, 7), team_id, user_id, token_id, model, served_model, upstream, tags,
       SUM(requests), SUM(errors), SUM(input_tokens), SUM(output_tokens), SUM(cost_micros)
FROM spend_days GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;

-- Adds a day row's sums (sign 1) or takes them away (-1) from its month; a month row whose
-- days are all gone is deleted (no day row has 0 requests).
CREATE FUNCTION spend_months_add(d spend_days, sign BIGINT) RETURNS void LANGUAGE sql AS $$
    INSERT INTO spend_months AS m (month, team_id, user_id, token_id, model, served_model, upstream, tags,
                                   requests, errors, input_tokens, output_tokens, cost_micros)
    VALUES (substr(d.day, 1, 7), d.team_id, d.user_id, d.token_id, d.model, d.served_model, d.upstream, d.tags,
            sign * d.requests, sign * d.errors, sign * d.input_tokens, sign * d.output_tokens, sign * d.cost_micros)
    ON CONFLICT (month, team_id, user_id, token_id, model, served_model, upstream, tags) DO UPDATE SET
        requests = m.requests + EXCLUDED.requests, errors = m.errors + EXCLUDED.errors,
        input_tokens = m.input_tokens + EXCLUDED.input_tokens,
        output_tokens = m.output_tokens + EXCLUDED.output_tokens,
        cost_micros = m.cost_micros + EXCLUDED.cost_micros;
    DELETE FROM spend_months
    WHERE month = substr(d.day, 1, 7) AND team_id = d.team_id AND user_id = d.user_id AND token_id = d.token_id
      AND model = d.model AND served_model = d.served_model AND upstream = d.upstream AND tags = d.tags
      AND requests = 0;
$$;

CREATE FUNCTION spend_months_follow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM spend_months_add(OLD, -1);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM spend_months_add(NEW, 1);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER spend_months_follow AFTER INSERT OR UPDATE OR DELETE ON spend_days FOR EACH ROW
WHEN (current_setting('sluice.spend_months', true) IS DISTINCT FROM 'written')
EXECUTE PROCEDURE spend_months_follow();
