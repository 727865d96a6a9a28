-- Token buckets of softcrum-jobs: checks and charges buckets atomically, for one acquisition
-- or for a batch of them (concurrent callers of one limiter coalesced into one call).
--
-- KEYS[k]  one string per bucket: "<tokens>:<refilled_at>" (ms since the epoch, server time).
-- ARGV[1]  'acquire' or 'drain'.
-- ARGV[2]  acquire: the number of acquisitions n; drain: the time (ms) at which tokens may
--          appear again.
-- ARGV[3 + 3(k-1) ..]  per key k: capacity, refill, interval (ms).
-- acquire, after the keys' triples: per acquisition, its cost, its number of buckets m, and
--          the m indexes of its buckets in KEYS.
--
-- Returns, per acquisition in order, {granted (1 or 0), ms}, flattened: for a denial, when the
-- slowest short bucket will have the cost. A drain returns {0, ms}: when its next tokens appear.
--
-- Only TIME, MGET and SET (with PX) are called, on keys passed in KEYS.

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local states = redis.call('MGET', unpack(KEYS))

-- Bucket k at `now`: a missing (or unreadable) bucket is full; otherwise `refill` tokens for
-- each whole interval since the last refill, capped at the capacity. A refill time in the
-- future (a drain's hold) adds nothing.
local function load(k)
  local at = 3 + (k - 1) * 3
  local b = {
    capacity = tonumber(ARGV[at]),
    refill = tonumber(ARGV[at + 1]),
    interval = tonumber(ARGV[at + 2]),
  }
  local state = states[k]
  if state then
    local tokens, refilled_at = string.match(state, '^(%d+):(%d+)$')
    b.tokens = tonumber(tokens)
    b.refilled_at = tonumber(refilled_at)
  end
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

-- Stores bucket k, expiring when it would be full again: a missing bucket is a full one.
local function store(k, b)
  redis.call('SET', KEYS[k], string.format('%d:%d', b.tokens, b.refilled_at),
    'PX', math.max(ready(b, b.capacity) - now, 1))
end

if ARGV[1] == 'acquire' then
  local buckets = {}
  for k = 1, #KEYS do
    buckets[k] = load(k)
  end
  local charged = {}
  local answers = {}
  local at = 3 + #KEYS * 3
  for _ = 1, tonumber(ARGV[2]) do
    local cost = tonumber(ARGV[at])
    local m = tonumber(ARGV[at + 1])
    local retry_at = nil
    for j = 1, m do
      local b = buckets[tonumber(ARGV[at + 1 + j])]
      if b.tokens < cost then
        local when = ready(b, cost)
        if retry_at == nil or when > retry_at then
          retry_at = when
        end
      end
    end
    if retry_at == nil then
      for j = 1, m do
        local k = tonumber(ARGV[at + 1 + j])
        buckets[k].tokens = buckets[k].tokens - cost
        charged[k] = true
      end
      answers[#answers + 1] = 1
      answers[#answers + 1] = now
    else
      answers[#answers + 1] = 0
      answers[#answers + 1] = retry_at
    end
    at = at + 2 + m
  end
  for k = 1, #KEYS do
    if charged[k] then
      store(k, buckets[k])
    end
  end
  return answers
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
