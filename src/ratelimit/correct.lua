-- Corrects token buckets from the admission estimate to the actual usage, in every window
-- of one booking in one call (their keys share a hash tag, so one slot on a cluster).
-- KEYS: the tokens key of each window; ARGV[1]: the admission second; ARGV[2]: delta
-- (actual − estimate). A bucket that is gone — its key expired, or its second already left
-- the window (or the booking was made in another store while Redis was failing) — is left
-- alone: HINCRBY would recreate it as a negative count, which would let more in than the
-- limit, and a recreated key would have no TTL.
for i = 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[1]) == 1 then
    redis.call('HINCRBY', KEYS[i], ARGV[1], ARGV[2])
  end
end
return 1
