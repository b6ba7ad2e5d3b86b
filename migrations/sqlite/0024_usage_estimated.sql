-- Whether a request's usage was estimated (issue 20): a side of it (input or output) the
-- upstream did not report, charged the gateway's own count (`pipeline::USAGE_ESTIMATED`).
-- Before, the only mark was `error_code = 'usage_estimated'`, which a row with another code
-- (`client_disconnected`, `upstream_error`, `shutting_down`) could not carry. The rows
-- logged before this migration have their old mark, and only it, to go by.
ALTER TABLE requests ADD COLUMN usage_estimated INTEGER NOT NULL DEFAULT 0;
UPDATE requests SET usage_estimated = 1 WHERE error_code = 'usage_estimated';

-- The spend rollups total the cost of the estimated requests (`store::spend`), at both
-- levels: `estimated_micros` is part of `cost_micros`, never more.
ALTER TABLE spend_days ADD COLUMN estimated_micros INTEGER NOT NULL DEFAULT 0;
ALTER TABLE spend_months ADD COLUMN estimated_micros INTEGER NOT NULL DEFAULT 0;

-- The month triggers (0023_spend_months.sql) carry the new column: the same triggers, with
-- `estimated_micros` beside `cost_micros`.
DROP TRIGGER spend_months_insert;
DROP TRIGGER spend_months_delete;
DROP TRIGGER spend_months_update;
DROP TRIGGER spend_months_rekey;

CREATE TRIGGER spend_months_insert AFTER INSERT ON spend_days BEGIN
    INSERT INTO spend_months (month, team_id, user_id, token_id, model, served_model, upstream, tags,
                              requests, errors, input_tokens, output_tokens, cost_micros, estimated_micros)
    VALUES (substr(NEW.day, 1, 7), NEW.team_id, NEW.user_id, NEW.token_id, NEW.model, NEW.served_model,
            NEW.upstream, NEW.tags, NEW.requests, NEW.errors, NEW.input_tokens, NEW.output_tokens, NEW.cost_micros,
            NEW.estimated_micros)
    ON CONFLICT (month, team_id, user_id, token_id, model, served_model, upstream, tags) DO UPDATE SET
        requests = requests + excluded.requests, errors = errors + excluded.errors,
        input_tokens = input_tokens + excluded.input_tokens,
        output_tokens = output_tokens + excluded.output_tokens,
        cost_micros = cost_micros + excluded.cost_micros,
        estimated_micros = estimated_micros + excluded.estimated_micros;
END;

CREATE TRIGGER spend_months_delete AFTER DELETE ON spend_days BEGIN
    UPDATE spend_months SET requests = requests - OLD.requests, errors = errors - OLD.errors,
        input_tokens = input_tokens - OLD.input_tokens, output_tokens = output_tokens - OLD.output_tokens,
        cost_micros = cost_micros - OLD.cost_micros, estimated_micros = estimated_micros - OLD.estimated_micros
    WHERE month = substr(OLD.day, 1, 7) AND team_id = OLD.team_id AND user_id = OLD.user_id
      AND token_id = OLD.token_id AND model = OLD.model AND served_model = OLD.served_model
      AND upstream = OLD.upstream AND tags = OLD.tags;
    DELETE FROM spend_months
    WHERE month = substr(OLD.day, 1, 7) AND team_id = OLD.team_id AND user_id = OLD.user_id
      AND token_id = OLD.token_id AND model = OLD.model AND served_model = OLD.served_model
      AND upstream = OLD.upstream AND tags = OLD.tags AND requests = 0;
END;

CREATE TRIGGER spend_months_update AFTER UPDATE ON spend_days
WHEN substr(OLD.day, 1, 7) = substr(NEW.day, 1, 7) AND OLD.team_id = NEW.team_id AND OLD.user_id = NEW.user_id
 AND OLD.token_id = NEW.token_id AND OLD.model = NEW.model AND OLD.served_model = NEW.served_model
 AND OLD.upstream = NEW.upstream AND OLD.tags = NEW.tags
BEGIN
    UPDATE spend_months SET requests = requests + NEW.requests - OLD.requests,
        errors = errors + NEW.errors - OLD.errors,
        input_tokens = input_tokens + NEW.input_tokens - OLD.input_tokens,
        output_tokens = output_tokens + NEW.output_tokens - OLD.output_tokens,
        cost_micros = cost_micros + NEW.cost_micros - OLD.cost_micros,
        estimated_micros = estimated_micros + NEW.estimated_micros - OLD.estimated_micros
    WHERE month = substr(NEW.day, 1, 7) AND team_id = NEW.team_id AND user_id = NEW.user_id
      AND token_id = NEW.token_id AND model = NEW.model AND served_model = NEW.served_model
      AND upstream = NEW.upstream AND tags = NEW.tags;
END;

CREATE TRIGGER spend_months_rekey AFTER UPDATE ON spend_days
WHEN NOT (substr(OLD.day, 1, 7) = substr(NEW.day, 1, 7) AND OLD.team_id = NEW.team_id AND OLD.user_id = NEW.user_id
 AND OLD.token_id = NEW.token_id AND OLD.model = NEW.model AND OLD.served_model = NEW.served_model
 AND OLD.upstream = NEW.upstream AND OLD.tags = NEW.tags)
BEGIN
    UPDATE spend_months SET requests = requests - OLD.requests, errors = errors - OLD.errors,
        input_tokens = input_tokens - OLD.input_tokens, output_tokens = output_tokens - OLD.output_tokens,
        cost_micros = cost_micros - OLD.cost_micros, estimated_micros = estimated_micros - OLD.estimated_micros
    WHERE month = substr(OLD.day, 1, 7) AND team_id = OLD.team_id AND user_id = OLD.user_id
      AND token_id = OLD.token_id AND model = OLD.model AND served_model = OLD.served_model
      AND upstream = OLD.upstream AND tags = OLD.tags;
    DELETE FROM spend_months
    WHERE month = substr(OLD.day, 1, 7) AND team_id = OLD.team_id AND user_id = OLD.user_id
      AND token_id = OLD.token_id AND model = OLD.model AND served_model = OLD.served_model
      AND upstream = OLD.upstream AND tags = OLD.tags AND requests = 0;
    INSERT INTO spend_months (month, team_id, user_id, token_id, model, served_model, upstream, tags,
                              requests, errors, input_tokens, output_tokens, cost_micros, estimated_micros)
    VALUES (substr(NEW.day, 1, 7), NEW.team_id, NEW.user_id, NEW.token_id, NEW.model, NEW.served_model,
            NEW.upstream, NEW.tags, NEW.requests, NEW.errors, NEW.input_tokens, NEW.output_tokens, NEW.cost_micros,
            NEW.estimated_micros)
    ON CONFLICT (month, team_id, user_id, token_id, model, served_model, upstream, tags) DO UPDATE SET
        requests = requests + excluded.requests, errors = errors + excluded.errors,
        input_tokens = input_tokens + excluded.input_tokens,
        output_tokens = output_tokens + excluded.output_tokens,
        cost_micros = cost_micros + excluded.cost_micros,
        estimated_micros = estimated_micros + excluded.estimated_micros;
END;

-- The days rolled up before: the estimated requests still in the log, summed per day row
-- they were rolled up into (the update trigger adds the same to the months). A lower bound
-- for those days: a row since pruned from the log, or whose tags the rollup's bound
-- rolled up under `(other)` (`store::tag_bound`), is not found.
UPDATE spend_days SET estimated_micros = min(e.micros, spend_days.cost_micros)
FROM (SELECT substr(created_at, 1, 10) AS day, COALESCE(team_id, 0) AS team_id, COALESCE(user_id, 0) AS user_id,
             token_id, model, served_model, upstream, tags, SUM(cost_micros) AS micros
      FROM requests WHERE usage_estimated = 1 AND token_id IS NOT NULL
      GROUP BY 1, 2, 3, 4, 5, 6, 7, 8) AS e
WHERE spend_days.day = e.day AND spend_days.team_id = e.team_id AND spend_days.user_id = e.user_id
  AND spend_days.token_id = e.token_id AND spend_days.model = e.model AND spend_days.served_model = e.served_model
  AND spend_days.upstream = e.upstream AND spend_days.tags = e.tags;
