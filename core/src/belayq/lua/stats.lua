-- stats.lua: one consistent snapshot of the queue's sizes and counters (read-only).
--
-- KEYS: the common vector (lib/common.lua).
-- Returns {ready, in_flight, leased, delayed, dead, field1, value1, ...} where the fields
-- are the counters of the stats hash.
-- @include common

local ready = 0
for _, list in ipairs(levels) do ready = ready + redis.call('LLEN', list) end
ready = ready - #redis.call('LPOS', levels[1], BELL, 'COUNT', 0)
local out = {ready, redis.call('LLEN', processing), redis.call('ZCARD', leases),
  redis.call('ZCARD', delayed), redis.call('LLEN', dead)}
for _, v in ipairs(redis.call('HGETALL', stats)) do out[#out + 1] = v end
return out
