-- The spend rollup's tag bound on combinations (see migrations/sqlite/0028_tag_sets.sql).
CREATE TABLE spend_tag_sets (
    day    TEXT COLLATE "C" NOT NULL,
    scope  TEXT COLLATE "C" NOT NULL,
    tags   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (day, scope, tags)
);

ALTER TABLE spend_tag_bound ADD COLUMN max_sets BIGINT NOT NULL DEFAULT 1000;
