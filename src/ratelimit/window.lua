-- Sluice's rate-limit windows: one atomic check-and-add per request, over every window
-- that applies to it (the token's, then the user's), in one round trip.
--
-- Requests: an exact sliding-window log in a sorted set (score = ms, member = request id,
-- unique, so same-millisecond requests never collapse).
-- Tokens: per-second buckets in a hash (field = unix second, value = tokens); admission
-- counts the estimate, and the caller corrects the bucket to the actual usage later.
--
-- Time is Redis's own (TIME), so replicas with skewed clocks agree. A rejected request is
-- not recorded anywhere. Every key gets a TTL of one window. The retry time of a refusal is
-- the time until enough has left the window for this request to fit (not merely the oldest
-- entry), the longest over the windows that refused.
--
-- On a Redis Cluster every key of one call hashes to one slot: the caller names them with
-- one hash tag (`sl:v2:{u:<user id>}:…`, `sl:v2:{k:<upstream id>}:…`).
--
-- KEYS: for each window i: requests key, tokens key
-- ARGV: window_ms, member, tokens, then for each window i: request limit, token limit (0 = none),
--       then valid_until: the Redis time (ms) after which the caller has given up on this
--       call (0 or absent: unknown)
-- Returns: { allowed (1/0), retry_after_ms, and for the first window: requests in window,
--            requests reset ms, tokens in window, tokens reset ms, admission second,
--            the kind that refused (0 none, 1 requests, 2 tokens, 3 too late),
--            Redis's time (ms) }

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local member = ARGV[2]
local cost = tonumber(ARGV[3])
local n = #KEYS / 2
local allowed = 1
local retry = 0
local refused_by = 0
local state = {}

-- A call that runs after its caller gave up on it (Redis stalled, the command still queued
-- on the connection) books nothing: its request was decided, and booked, by the caller's
-- local store.
local valid_until = tonumber(ARGV[4 + 2 * n] or '0') or 0
if valid_until > 0 and now > valid_until then
  return { 0, 0, 0, 0, 0, 0, 0, 3, now }
end

-- How long until `k` more requests fit: until the k-th oldest entry leaves (k = count + 1 −
-- limit; more than one when the limit was lowered below what the window holds).
local function requests_retry(rkey, count, rlimit)
  local k = count - rlimit
  local entry = redis.call('ZRANGE', rkey, k, k, 'WITHSCORES')
  if entry[2] then return tonumber(entry[2]) + window - now end
  return window
end

-- How long until `need` tokens have left: buckets oldest first until enough have gone
-- (all of them for a request larger than the limit, which an empty window admits).
local function tokens_retry(live, need)
  table.sort(live, function(a, b) return a[1] < b[1] end)
  local freed, last = 0, nil
  for _, b in ipairs(live) do
    freed = freed + b[2]
    last = b[1]
    if freed >= need then break end
  end
  if last == nil then return 0 end
  return (last + 1) * 1000 + window - now
end

for i = 1, n do
  local rkey, tkey = KEYS[2 * i - 1], KEYS[2 * i]
  local rlimit, tlimit = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  local count, rreset, used, treset = 0, 0, 0, 0
  if rlimit > 0 then
    redis.call('ZREMRANGEBYSCORE', rkey, '-inf', now - window)
    count = redis.call('ZCARD', rkey)
    local oldest = redis.call('ZRANGE', rkey, 0, 0, 'WITHSCORES')
    if oldest[2] then rreset = tonumber(oldest[2]) + window - now end
    if count + 1 > rlimit then
      allowed = 0
      refused_by = 1
      local r = requests_retry(rkey, count, rlimit)
      if r > retry then retry = r end
    end
  end
  if tlimit > 0 then
    local cutoff = math.floor((now - window) / 1000)
    local buckets = redis.call('HGETALL', tkey)
    local oldest_sec = nil
    local live = {}
    for j = 1, #buckets, 2 do
      local sec = tonumber(buckets[j])
      -- booked as late as sec + 0.999: it leaves at (sec + 1) + window
      if sec < cutoff then
        redis.call('HDEL', tkey, buckets[j])
      else
        local n = tonumber(buckets[j + 1])
        used = used + n
        live[#live + 1] = { sec, n }
        if oldest_sec == nil or sec < oldest_sec then oldest_sec = sec end
      end
    end
    if oldest_sec then treset = (oldest_sec + 1) * 1000 + window - now end
    -- One request larger than the whole limit is let through into an empty window.
    if used > 0 and used + cost > tlimit then
      allowed = 0
      if refused_by == 0 then refused_by = 2 end
      local r = tokens_retry(live, used + cost - tlimit)
      if r > retry then retry = r end
    end
  end
  state[i] = { count, rreset, used, treset }
end

local second = math.floor(now / 1000)
if allowed == 1 then
  for i = 1, n do
    local rkey, tkey = KEYS[2 * i - 1], KEYS[2 * i]
    if tonumber(ARGV[2 + 2 * i]) > 0 then
      redis.call('ZADD', rkey, now, member)
      redis.call('PEXPIRE', rkey, window)
      state[i][1] = state[i][1] + 1
      if state[i][2] == 0 then state[i][2] = window end
    end
    if tonumber(ARGV[3 + 2 * i]) > 0 then
      redis.call('HINCRBY', tkey, second, cost)
      redis.call('PEXPIRE', tkey, window + 1000)
      state[i][3] = state[i][3] + cost
      if state[i][4] == 0 then state[i][4] = window end
    end
  end
end

return { allowed, retry, state[1][1], state[1][2], state[1][3], state[1][4], second, refused_by, now }
