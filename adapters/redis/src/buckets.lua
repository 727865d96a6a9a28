-- Token buckets of softcrum-jobs: checks and charges every bucket of one call atomically.
--
-- KEYS[i]  one hash per bucket: tokens, refilled_at (ms since the epoch, server time).
-- ARGV[1]  'acquire' or 'drain'.
-- ARGV[2]  acquire: the cost; drain: the time (ms) at which tokens may appear again.
-- ARGV[3 + 3(i-1) ..]  per key: capacity, refill, interval (ms).
--
-- Returns {granted (1 or 0), ms}: for a denial, when the slowest short bucket will have the
-- cost; for a drain, when its next tokens appear.
--
-- Only TIME, HMGET, HSET and PEXPIRE are called, on keys passed in KEYS.

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local function text(n)
  return string.format('%.0f', n)
end

-- The bucket at `now`: a missing (or unreadable) bucket is full; otherwise `refill` tokens
-- for each whole interval since the last refill, capped at the capacity. A refill time in the
-- future (a drain's hold) adds nothing.
local function load(i)
  local at = 3 + (i - 1) * 3
  local b = {
    capacity = tonumber(ARGV[at]),
    refill = tonumber(ARGV[at + 1]),
    interval = tonumber(ARGV[at + 2]),
  }
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'refilled_at')
  b.tokens = tonumber(state[1])
  b.refilled_at = tonumber(state[2])
  if b.tokens == nil or b.refilled_at == nil then
    b.tokens = b.capacity
    b.refilled_at = now
  elseif now >= b.refilled_at + b.interval then
    local whole = math.floor((now - b.refilled_at) / b.interval)
    b.tokens = b.tokens + whole * b.refill
    b.refilled_at = b.refilled_at + whole * b.interval
  end
  if b.tokens > b.capacity then
    b.tokens = b.capacity
  end
  return b
end

-- When bucket `b` will hold `wanted` tokens.
local function ready(b, wanted)
  if b.tokens >= wanted then
    return now
  end
  return b.refilled_at + math.ceil((wanted - b.tokens) / b.refill) * b.interval
end

-- Stores bucket `b`, expiring when it would be full again: a missing bucket is a full one.
local function store(i, b)
  redis.call('HSET', KEYS[i], 'tokens', text(b.tokens), 'refilled_at', text(b.refilled_at))
  redis.call('PEXPIRE', KEYS[i], text(math.max(ready(b, b.capacity) - now, 1)))
end

if ARGV[1] == 'acquire' then
  local cost = tonumber(ARGV[2])
  local buckets = {}
  local retry_at = nil
  for i = 1, #KEYS do
    local b = load(i)
    buckets[i] = b
    if b.tokens < cost then
      local at = ready(b, cost)
      if retry_at == nil or at > retry_at then
        retry_at = at
      end
    end
  end
  if retry_at ~= nil then
    return {0, retry_at}
  end
  for i = 1, #KEYS do
    local b = buckets[i]
    b.tokens = b.tokens - cost
    store(i, b)
  end
  return {1, now}
end

if ARGV[1] == 'drain' then
  local b = load(1)
  -- The next refill comes one interval after refilled_at: put it at `until`, unless a longer
  -- hold is already in place.
  local hold = tonumber(ARGV[2]) - b.interval
  if hold > b.refilled_at then
    b.refilled_at = hold
  end
  b.tokens = 0
  store(1, b)
  return {0, b.refilled_at + b.interval}
end

return redis.error_reply('unknown mode ' .. tostring(ARGV[1]))
