-- Liveness by the database's clock (issue 17): `seen_at` is when the database received a
-- process's latest heartbeat, by its own clock (`clock_timestamp()`), and the dead check
-- compares it with that same clock. `heartbeat_at` (the process's own clock) stays: a
-- lease is expired when it is older than its owner's beat, both by the owner's clock. A
-- host whose clock runs ahead no longer takes every other live host for dead. Kept as
-- TIMESTAMPTZ (not the fixed-width text of the other times): only SQL reads it.
ALTER TABLE processes ADD COLUMN seen_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp();
