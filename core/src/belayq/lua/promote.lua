-- promote.lua: make up to `limit` delayed messages ready now, whenever they were due (the
-- earliest due first), each at the back of its ready list: for a rollback to a transport
-- that keeps no delayed set, or to run what waits at once.
--
-- KEYS[1] delayed    zset id -> due time
-- KEYS[2] meta       hash id -> state
-- KEYS[3] payloads   hash id -> payload (inline mode: the payload waits here)
-- KEYS[4] stats      hash of counters
-- KEYS[5..] levels   ready lists, highest priority first
-- ARGV[1..6]         see includes/context.lua
-- ARGV[7] limit      most messages made ready by this call
-- Returns {promoted, more}: more is 1 when delayed messages are left (call again).
-- FLAGS: none: a full server (maxmemory) refuses it whole, before anything moves
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include counters
-- @include meta
-- @include ready
-- @include settle

local k = {delayed = KEYS[1], meta = KEYS[2], payloads = KEYS[3], stats = KEYS[4], levels = {}}
for i = 5, #KEYS do k.levels[#k.levels + 1] = KEYS[i] end
args_exactly(7)
local limit = int_arg(7, 'limit', 1)

local ids = redis.call('ZRANGE', k.delayed, 0, limit - 1)
local metas = {}
for j, id in ipairs(ids) do metas[j] = meta_get(k.meta, id) or meta_new(1, 0) end

local promoted = 0
for j, id in ipairs(ids) do
  redis.call('ZREM', k.delayed, id)
  if to_ready(k, id, metas[j], false) then promoted = promoted + 1 end
end
fix_door(k.levels)
count(k.stats, 'promoted', promoted)
return {promoted, redis.call('ZCARD', k.delayed) > 0 and 1 or 0}
