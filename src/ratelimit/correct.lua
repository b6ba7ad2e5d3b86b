-- Corrects token buckets from the admission estimate to the actual usage, in every window
-- of one booking in one call (their keys share a hash tag, so one slot on a cluster).
-- KEYS: the tokens key of each window; ARGV[1]: the admission second; ARGV[2]: delta
-- (actual − estimate); ARGV[3]: window_ms. Only bookings made in Redis are corrected here
-- (the caller keeps a local booking's correction in the local store).
--
-- The admission bucket still in the window takes the delta, and never ends below 0: one
-- recreated in the same second after its key was lost (FLUSHALL, an eviction, a failover)
-- holds less than the lost booking's estimate.
-- A bucket that is gone — its key expired, or its second left the window (a stream longer
-- than the window) — has counted its estimate already. A positive delta is the tokens used
-- beyond it, not yet counted anywhere: it is booked in the current second (with the
-- window's TTL, as `window.lua` books), so the whole usage is counted once. A negative
-- delta is dropped: HINCRBY would write a negative count, which would let more in than the
-- limit, and what it would give back has left the window already.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local second = tonumber(ARGV[1])
local delta = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
-- As in `window.lua`: a bucket of second s leaves at (s + 1) s + window.
local cutoff = math.floor((now - window) / 1000)
local current = math.floor(now / 1000)
for i = 1, #KEYS do
  if second >= cutoff and redis.call('HEXISTS', KEYS[i], ARGV[1]) == 1 then
    if redis.call('HINCRBY', KEYS[i], ARGV[1], delta) < 0 then
      redis.call('HSET', KEYS[i], ARGV[1], 0)
    end
  elseif delta > 0 then
    redis.call('HINCRBY', KEYS[i], current, delta)
    redis.call('PEXPIRE', KEYS[i], window + 1000)
  end
end
return 1
