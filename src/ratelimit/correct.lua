-- Corrects token buckets from the admission estimate to the actual usage, in every window
-- of one booking in one call (their keys share a hash tag, so one slot on a cluster).
-- KEYS: the tokens key of each window; ARGV[1]: the admission second; ARGV[2]: delta
-- (actual − estimate); ARGV[3]: window_ms. Only bookings made in Redis are corrected here
-- (the caller keeps a local booking's correction in the local store).
--
-- A positive delta is the tokens used beyond the estimate the admission bucket counted: it
-- is booked in the current second (with the window's TTL, as `window.lua` books), counted
-- for a whole window from when it is known, so the whole usage is counted once. A negative
-- delta is taken from the admission bucket while that is in the window, never below 0 (one
-- recreated in the same second after its key was lost — FLUSHALL, an eviction, a failover —
-- holds less than the lost booking's estimate); once it is gone (its key expired, or its
-- second left the window) the delta is dropped: HINCRBY would write a negative count, which
-- would let more in than the limit, and what it would give back has left the window already.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local second = tonumber(ARGV[1])
local delta = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
-- As in `window.lua`: a bucket of second s leaves at (s + 1) s + window.
local cutoff = math.floor((now - window) / 1000)
local current = math.floor(now / 1000)
-- A positive delta goes to the current second even while the admission bucket is in the
-- window: there it counted only for what was left of that bucket's — a second, for a stream
-- ending just inside the window (s29 final attack F2).
for i = 1, #KEYS do
  if delta > 0 then
    redis.call('HINCRBY', KEYS[i], current, delta)
    redis.call('PEXPIRE', KEYS[i], window + 1000)
  elseif second >= cutoff and redis.call('HEXISTS', KEYS[i], ARGV[1]) == 1 then
    if redis.call('HINCRBY', KEYS[i], ARGV[1], delta) < 0 then
      redis.call('HSET', KEYS[i], ARGV[1], 0)
    end
  end
end
return 1
