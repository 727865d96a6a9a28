-- Token buckets of softcrum-jobs: checks and charges buckets atomically, for one acquisition
-- or for a batch of them (concurrent callers of one limiter coalesced into one call).
--
-- KEYS[k]  one string per bucket: "<tokens>:<refilled_at>" (ms since the epoch, server time).
-- ARGV[1]  'acquire' or 'drain'.
-- ARGV[2]  acquire: the acquisitions in order, one byte each: the number (from 1) of its
--          request below; drain: the time (ms) at which tokens may appear again.
-- ARGV[3k .. 3k + 2]  per key k: capacity, refill, interval (ms).
-- acquire, after the keys' triples: per distinct request (a cost and a set of buckets, shared
--          by every acquisition that asks the same), its cost, its number of buckets m, and
--          the m indexes of its buckets in KEYS.
--
-- Returns, per acquisition in order, 0 when granted, or when denied the time (ms) at which the
-- slowest short bucket will have the cost. A drain returns {0, ms}: when its next tokens appear.
--
-- Only TIME, MGET and SET (with PX) are called, on keys passed in KEYS.
--
-- Every call pays for this script's Lua on the server, so it is written for that: locals
-- instead of globals, flat arrays instead of a table per bucket, strings coerced by arithmetic
-- instead of tonumber, and each distinct request parsed once however many acquisitions share
-- it (ADR 0007 has the measurements).

local argv, keys, floor, ceil = ARGV, KEYS, math.floor, math.ceil
local time = redis.call('TIME')
local now = time[1] * 1000 + floor(time[2] / 1000)
local nkeys = #keys
local states = redis.call('MGET', unpack(keys))

-- Bucket k at `now` in tokens[k], refilled_at[k]: a missing (or unreadable) bucket is full;
-- otherwise `refill` tokens for each whole interval since the last refill, capped at the
-- capacity. A refill time in the future (a drain's hold) adds nothing.
local tokens, refilled_at = {}, {}
for k = 1, nkeys do
  local capacity, interval = argv[3 * k] + 0, argv[3 * k + 2] + 0
  local t, at
  if states[k] then
    t, at = string.match(states[k], '^(%d+):(%d+)$')
  end
  if at == nil then
    t, at = capacity, now
  else
    t, at = t + 0, at + 0
    if now >= at + interval then
      local whole = floor((now - at) / interval)
      t = t + whole * argv[3 * k + 1]
      at = at + whole * interval
    end
    if t > capacity then
      t = capacity
    end
  end
  tokens[k], refilled_at[k] = t, at
end

-- Stores bucket k, expiring when it would be full again: a missing bucket is a full one.
local function store(k)
  local t, at = tokens[k], refilled_at[k]
  local full = at + ceil((argv[3 * k] - t) / argv[3 * k + 1]) * argv[3 * k + 2]
  redis.call('SET', keys[k], string.format('%d:%d', t, at), 'PX', math.max(full - now, 1))
end

if argv[1] == 'acquire' then
  -- The distinct requests: request r's cost in requests[3r - 2], and its buckets' indexes in
  -- members[requests[3r - 1] .. requests[3r]].
  local requests, members = {}, {}
  local at, r, count = 3 + nkeys * 3, 0, 0
  while argv[at] do
    local last = at + 1 + argv[at + 1]
    requests[r + 1], requests[r + 2] = argv[at] + 0, count + 1
    for j = at + 2, last do
      count = count + 1
      members[count] = argv[j] + 0
    end
    requests[r + 3] = count
    r = r + 3
    at = last + 1
  end
  local order, answers, charged = argv[2], {}, {}
  for n = 1, #order do
    local r = 3 * string.byte(order, n)
    local cost, first, last = requests[r - 2], requests[r - 1], requests[r]
    -- The latest time at which a short bucket of this acquisition will hold `cost` tokens.
    local retry_at = 0
    for j = first, last do
      local k = members[j]
      local t = tokens[k]
      if t < cost then
        local when = refilled_at[k] + ceil((cost - t) / argv[3 * k + 1]) * argv[3 * k + 2]
        if when > retry_at then
          retry_at = when
        end
      end
    end
    if retry_at == 0 then
      for j = first, last do
        local k = members[j]
        tokens[k] = tokens[k] - cost
        charged[k] = true
      end
    end
    answers[n] = retry_at
  end
  for k = 1, nkeys do
    if charged[k] then
      store(k)
    end
  end
  return answers
end

if argv[1] == 'drain' then
  -- The next refill comes one interval after refilled_at: put it at `until`, unless a longer
  -- hold is already in place.
  local interval = argv[5] + 0
  local hold = argv[2] - interval
  if hold > refilled_at[1] then
    refilled_at[1] = hold
  end
  tokens[1] = 0
  store(1)
  return {0, refilled_at[1] + interval}
end

return redis.error_reply('unknown mode ' .. tostring(argv[1]))
