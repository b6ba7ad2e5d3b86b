-- The spend rollup's bound on tag cardinality (see migrations/sqlite/0021_tag_bound.sql).
CREATE TABLE spend_tag_values (
    day    TEXT COLLATE "C" NOT NULL,
    key    TEXT COLLATE "C" NOT NULL,
    value  TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (day, key, value)
);

CREATE TABLE spend_tag_bound (
    id          BIGINT PRIMARY KEY CHECK (id = 1),
    max_values  BIGINT NOT NULL
);
INSERT INTO spend_tag_bound (id, max_values) VALUES (1, 1000);
