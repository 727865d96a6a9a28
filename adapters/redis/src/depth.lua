-- The approximate depth of one queue: a sorted set of the job ids published and not yet
-- acked, each scored by the time (ms) it becomes visible. Members visible longer ago than the
-- horizon are dropped, so a lost decrement corrects itself.
--
-- KEYS[1] the queue's sorted set
-- ARGV[1] 'add' | 'remove' | 'count'
-- ARGV[2] horizon in ms
-- ARGV[3] member (add, remove)
-- ARGV[4] delay in ms (add)
-- Answers {ready, delayed} for 'count', {changed} otherwise.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local horizon = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - horizon))
local mode = ARGV[1]
if mode == 'add' then
  local visible = now + tonumber(ARGV[4])
  local added = redis.call('ZADD', KEYS[1], 'NX', visible, ARGV[3])
  -- Keep the set until its last member would be dropped anyway.
  local ttl = visible + horizon - now
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return {added}
elseif mode == 'remove' then
  return {redis.call('ZREM', KEYS[1], ARGV[3])}
elseif mode == 'count' then
  local ready = redis.call('ZCOUNT', KEYS[1], '-inf', now)
  local delayed = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
  return {ready, delayed}
end
return redis.error_reply('unknown mode ' .. tostring(mode))
