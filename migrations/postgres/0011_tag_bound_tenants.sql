-- The spend rollup's tag bound per tenant, and on keys too (see
-- migrations/sqlite/0022_tag_bound_tenants.sql).
DROP TABLE spend_tag_values;

CREATE TABLE spend_tag_keys (
    day    TEXT COLLATE "C" NOT NULL,
    scope  TEXT COLLATE "C" NOT NULL,
    key    TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (day, scope, key)
);

-- `scope` defaults to '' for the previous version's writes during a rolling upgrade.
CREATE TABLE spend_tag_values (
    day    TEXT COLLATE "C" NOT NULL,
    scope  TEXT COLLATE "C" NOT NULL DEFAULT '',
    key    TEXT COLLATE "C" NOT NULL,
    value  TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (day, scope, key, value)
);

ALTER TABLE spend_tag_bound ADD COLUMN max_keys BIGINT NOT NULL DEFAULT 100;
