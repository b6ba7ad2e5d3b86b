-- The spend rollup's bound on tag cardinality (`store::tag_bound`): the distinct values of
-- each tag key admitted to `spend_days` per UTC day, and the bound (`[finance]
-- max_tag_values_per_day`, written at start). A later value rolls up under `(other)`.
-- Days rolled up before this migration are not counted: their values count from their
-- next request on.
CREATE TABLE spend_tag_values (
    day    TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (day, key, value)
) WITHOUT ROWID;

CREATE TABLE spend_tag_bound (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    max_values  INTEGER NOT NULL
);
INSERT INTO spend_tag_bound (id, max_values) VALUES (1, 1000);
