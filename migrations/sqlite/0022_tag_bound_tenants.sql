-- The spend rollup's tag bound per tenant, and on keys too (`store::tag_bound`): a tenant's
-- (the team's; a user's without one) distinct tag keys per UTC day (`[finance]
-- max_tag_keys_per_day`, written at start and on SIGHUP), and its distinct values of each
-- key. The values admitted so far were counted across tenants: they start again from the
-- next request, as at 0021.
DROP TABLE spend_tag_values;

CREATE TABLE spend_tag_keys (
    day    TEXT NOT NULL,
    scope  TEXT NOT NULL,
    key    TEXT NOT NULL,
    PRIMARY KEY (day, scope, key)
) WITHOUT ROWID;

-- `scope` defaults to '' so the previous version, still running during a rolling upgrade and
-- writing (day, key, value), admits under no tenant instead of failing.
CREATE TABLE spend_tag_values (
    day    TEXT NOT NULL,
    scope  TEXT NOT NULL DEFAULT '',
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (day, scope, key, value)
) WITHOUT ROWID;

ALTER TABLE spend_tag_bound ADD COLUMN max_keys INTEGER NOT NULL DEFAULT 100;
