-- The spend rollup's monthly level (`store::spend`): `spend_days` summed per UTC month
-- ('YYYY-MM' = substr(day, 1, 7)) over the same dimensions, so a report over whole months
-- reads twelve rows a year per group instead of 365.
--
-- It is kept by triggers on `spend_days`, in the statement that changes the day row: every
-- writer of the days — this version's request log, the previous version's during a rolling
-- upgrade, `sluice migrate-store`, a hand-made fix — keeps the months equal to the sum of
-- their days, with nothing for a report to check. A month row whose days are all gone is
-- deleted (no day row has 0 requests), so a report by months finds exactly the groups the
-- days hold.
CREATE TABLE spend_months (
    month         TEXT    NOT NULL,            -- substr(day, 1, 7)
    team_id       INTEGER NOT NULL,
    user_id       INTEGER NOT NULL,
    token_id      INTEGER NOT NULL,
    model         TEXT    NOT NULL,
    served_model  TEXT    NOT NULL,
    upstream      TEXT    NOT NULL,
    tags          TEXT    NOT NULL,
    requests      INTEGER NOT NULL,
    errors        INTEGER NOT NULL,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cost_micros   INTEGER NOT NULL,
    PRIMARY KEY (month, team_id, user_id, token_id, model, served_model, upstream, tags)
) WITHOUT ROWID;
CREATE INDEX spend_months_team ON spend_months(team_id, month);

INSERT INTO spend_months (month, team_id, user_id, token_id, model, served_model, upstream, tags,
                          requests, errors, input_tokens, output_tokens, cost_micros)
SELECT substr(day, 1, 7), team_id, user_id, token_id, model, served_model, upstream, tags,
       SUM(requests), SUM(errors), SUM(input_tokens), SUM(output_tokens), SUM(cost_micros)
FROM spend_days GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;

CREATE TRIGGER spend_months_insert AFTER INSERT ON spend_days BEGIN
    INSERT INTO spend_months (month, team_id, user_id, token_id, model, served_model, upstream, tags,
                              requests, errors, input_tokens, output_tokens, cost_micros)
    VALUES (substr(NEW.day, 1, 7), NEW.team_id, NEW.user_id, NEW.token_id, NEW.model, NEW.served_model,
            NEW.upstream, NEW.tags, NEW.requests, NEW.errors, NEW.input_tokens, NEW.output_tokens, NEW.cost_micros)
    ON CONFLICT (month, team_id, user_id, token_id, model, served_model, upstream, tags) DO UPDATE SET
        requests = requests + excluded.requests, errors = errors + excluded.errors,
        input_tokens = input_tokens + excluded.input_tokens,
        output_tokens = output_tokens + excluded.output_tokens,
        cost_micros = cost_micros + excluded.cost_micros;
END;

CREATE TRIGGER spend_months_delete AFTER DELETE ON spend_days BEGIN
    UPDATE spend_months SET requests = requests - OLD.requests, errors = errors - OLD.errors,
        input_tokens = input_tokens - OLD.input_tokens, output_tokens = output_tokens - OLD.output_tokens,
        cost_micros = cost_micros - OLD.cost_micros
    WHERE month = substr(OLD.day, 1, 7) AND team_id = OLD.team_id AND user_id = OLD.user_id
      AND token_id = OLD.token_id AND model = OLD.model AND served_model = OLD.served_model
      AND upstream = OLD.upstream AND tags = OLD.tags;
    DELETE FROM spend_months
    WHERE month = substr(OLD.day, 1, 7) AND team_id = OLD.team_id AND user_id = OLD.user_id
      AND token_id = OLD.token_id AND model = OLD.model AND served_model = OLD.served_model
      AND upstream = OLD.upstream AND tags = OLD.tags AND requests = 0;
END;

-- An upsert's `DO UPDATE` (the request log adding to a day) fires this one: the difference
-- goes to the month. A change of a day row's key (nothing does it) is taken as the old row
-- deleted and the new one inserted (`spend_months_rekey`), so it cannot move spend unseen.
CREATE TRIGGER spend_months_update AFTER UPDATE ON spend_days
WHEN substr(OLD.day, 1, 7) = substr(NEW.day, 1, 7) AND OLD.team_id = NEW.team_id AND OLD.user_id = NEW.user_id
 AND OLD.token_id = NEW.token_id AND OLD.model = NEW.model AND OLD.served_model = NEW.served_model
 AND OLD.upstream = NEW.upstream AND OLD.tags = NEW.tags
BEGIN
    UPDATE spend_months SET requests = requests + NEW.requests - OLD.requests,
        errors = errors + NEW.errors - OLD.errors,
        input_tokens = input_tokens + NEW.input_tokens - OLD.input_tokens,
        output_tokens = output_tokens + NEW.output_tokens - OLD.output_tokens,
        cost_micros = cost_micros + NEW.cost_micros - OLD.cost_micros
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
        cost_micros = cost_micros - OLD.cost_micros
    WHERE month = substr(OLD.day, 1, 7) AND team_id = OLD.team_id AND user_id = OLD.user_id
      AND token_id = OLD.token_id AND model = OLD.model AND served_model = OLD.served_model
      AND upstream = OLD.upstream AND tags = OLD.tags;
    DELETE FROM spend_months
    WHERE month = substr(OLD.day, 1, 7) AND team_id = OLD.team_id AND user_id = OLD.user_id
      AND token_id = OLD.token_id AND model = OLD.model AND served_model = OLD.served_model
      AND upstream = OLD.upstream AND tags = OLD.tags AND requests = 0;
    INSERT INTO spend_months (month, team_id, user_id, token_id, model, served_model, upstream, tags,
                              requests, errors, input_tokens, output_tokens, cost_micros)
    VALUES (substr(NEW.day, 1, 7), NEW.team_id, NEW.user_id, NEW.token_id, NEW.model, NEW.served_model,
            NEW.upstream, NEW.tags, NEW.requests, NEW.errors, NEW.input_tokens, NEW.output_tokens, NEW.cost_micros)
    ON CONFLICT (month, team_id, user_id, token_id, model, served_model, upstream, tags) DO UPDATE SET
        requests = requests + excluded.requests, errors = errors + excluded.errors,
        input_tokens = input_tokens + excluded.input_tokens,
        output_tokens = output_tokens + excluded.output_tokens,
        cost_micros = cost_micros + excluded.cost_micros;
END;
