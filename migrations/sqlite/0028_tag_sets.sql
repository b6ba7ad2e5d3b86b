-- The spend rollup's tag bound on combinations (`store::tag_bound`): a tenant's distinct tag
-- texts per UTC day — the pairs of a request the admin did not set, after its keys and
-- values are bounded — and their bound (`[finance] max_tag_sets_per_day`, written at start
-- and on SIGHUP). Keys and values alone did not bound the rollup: two keys of 1 000 values
-- each still made a row per request. A later text is rolled up pair by pair to
-- `key:(other)`, else to `(other):(other)`.
--
-- `max_sets` defaults to 1000 so the previous version, still running during a rolling
-- upgrade, keeps writing its bounds (values and keys only) unchanged; its rows are not
-- bounded by texts. Texts rolled up before this migration are not counted: on the day of
-- the upgrade they count from the next request on.
CREATE TABLE spend_tag_sets (
    day    TEXT NOT NULL,
    scope  TEXT NOT NULL,
    tags   TEXT NOT NULL,
    PRIMARY KEY (day, scope, tags)
) WITHOUT ROWID;

ALTER TABLE spend_tag_bound ADD COLUMN max_sets INTEGER NOT NULL DEFAULT 1000;
