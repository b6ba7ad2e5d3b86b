-- The sign-in throttle's counters by typed name go (see
-- migrations/sqlite/0026_throttle_names.sql).
DELETE FROM login_failures WHERE key LIKE 'user:%';
