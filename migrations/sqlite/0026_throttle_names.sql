-- The sign-in throttle counts a name under its HMAC now (`auth::throttle::name_key`), never
-- the typed text: the counters kept before it held what was typed in clear — a password
-- pasted into the name field among them — and the sweep keeps the newest rows however old
-- (`store::sessions`). They go; the names' counts start again, the addresses' stay.
DELETE FROM login_failures WHERE key LIKE 'user:%';
