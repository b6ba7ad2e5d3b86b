-- Corrects token buckets from the admission estimate to the actual usage, in every window
-- of one booking in one call (their keys share a hash tag, so one slot on a cluster).
-- KEYS: the tokens key of each window; ARGV[1]: the admission second; ARGV[2]: delta
-- (actual − estimate). Only bookings made in Redis are corrected here (the caller keeps a
-- local booking's correction in the local store). A bucket that is gone — its key expired,
-- or its second already left the window — is left alone: HINCRBY would recreate it as a
-- negative count, which would let more in than the limit, and a recreated key would have
-- no TTL. And a bucket never ends below 0: one recreated in the same second after its key
-- was lost (FLUSHALL, an eviction, a failover) holds less than the lost booking's estimate.
for i = 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[1]) == 1 then
    if redis.call('HINCRBY', KEYS[i], ARGV[1], ARGV[2]) < 0 then
      redis.call('HSET', KEYS[i], ARGV[1], 0)
    end
  end
end
return 1
