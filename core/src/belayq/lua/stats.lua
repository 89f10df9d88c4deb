-- stats.lua: one consistent snapshot of the queue's sizes and counters (read-only).
--
-- KEYS[1] processing, KEYS[2] leases, KEYS[3] delayed, KEYS[4] dead, KEYS[5] stats,
-- KEYS[6..] levels
-- ARGV[1..6]  see includes/context.lua
-- Returns {ready, in_flight, landing, delayed, dead, field1, value1, ...}: in_flight counts
-- leases (provisional ones too), landing the entries between BLMOVE and their lease; the
-- fields are the counters of the stats hash. The bell is not counted as ready: it is looked
-- for among the first 1,000 entries from the head (constants.BELL_SCAN), where it sits (it
-- is rung into an empty list, and only hand-backs are pushed before it), so that the cost
-- stays O(1) in the queue's length; one deeper still would count once.
-- FLAGS: no-writes (read-only: a full server and a replica run it)
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include ready

args_exactly(6)
local ready = 0
for i = 6, #KEYS do ready = ready + redis.call('LLEN', KEYS[i]) end
if redis.call('LPOS', KEYS[6], BELL, 'RANK', HEAD_LEFT and 1 or -1, 'MAXLEN', 1000) then
  ready = ready - 1
end
local out = {ready, redis.call('ZCARD', KEYS[2]), redis.call('LLEN', KEYS[1]),
  redis.call('ZCARD', KEYS[3]), redis.call('ZCARD', KEYS[4])}
for _, v in ipairs(redis.call('HGETALL', KEYS[5])) do out[#out + 1] = v end
return out
