-- Corrects a token bucket from the admission estimate to the actual usage.
-- KEYS[1]: tokens key; ARGV[1]: the admission second; ARGV[2]: delta (actual − estimate).
-- A bucket that already expired is left alone (HINCRBY would recreate it without a TTL).
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
end
return 1
