-- Corrects token buckets from the admission estimate to the actual usage, in every window
-- of one booking in one call (their keys share a hash tag, so one slot on a cluster).
-- KEYS: the tokens key of each window; ARGV[1]: the admission second; ARGV[2]: delta
-- (actual − estimate). A bucket that already expired is left alone (HINCRBY would recreate
-- it without a TTL).
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('HINCRBY', KEYS[i], ARGV[1], ARGV[2])
  end
end
return 1
