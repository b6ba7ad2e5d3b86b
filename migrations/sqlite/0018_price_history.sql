-- Prices admins set (issue 20 item 3), append-only: an edit adds a row effective from a
-- date at or after its own instant, so no request already priced is priced again. A
-- model's schedule is these rows, then the config file's prices, then the bundled table
-- (`quota::schedule`). `prices` is the row's price as JSON, integer micro-dollars per
-- million tokens by kind ({"input":150000,"output":600000,"cached_input":75000}): a new
-- kind of price is one more key, no new column.
CREATE TABLE model_prices (
    id              INTEGER PRIMARY KEY,
    model           TEXT NOT NULL,
    effective_from  TEXT NOT NULL,
    prices          TEXT NOT NULL,
    created_by      TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    UNIQUE (model, effective_from)
);
CREATE TRIGGER model_prices_no_update BEFORE UPDATE ON model_prices
BEGIN SELECT RAISE(ABORT, 'model_prices is append-only'); END;
CREATE TRIGGER model_prices_no_delete BEFORE DELETE ON model_prices
BEGIN SELECT RAISE(ABORT, 'model_prices is append-only'); END;
