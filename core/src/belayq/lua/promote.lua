-- promote.lua: make up to `limit` delayed messages ready now, whenever they were due (the
-- earliest due first), each at the back of its ready list: for a rollback to a transport
-- that keeps no delayed set, or to run what waits at once.
--
-- KEYS[1] delayed    zset id -> due time
-- KEYS[2] meta       hash id -> state
-- KEYS[3] payloads   hash id -> payload (inline mode: the payload waits here)
-- KEYS[4] stats      hash of counters
-- KEYS[5] memo       hash: this call's reply, for a re-sent call
-- KEYS[6] memo_exp   zset memo field -> expiry
-- KEYS[7..] levels   ready lists, highest priority first
-- ARGV[1..6]         see includes/context.lua
-- ARGV[7] limit      most messages made ready by this call
-- Returns {promoted, more}: more is 1 when delayed messages are left (call again). A call
-- re-sent with the same request id answers as its first run did and moves nothing more, even
-- when the first run moved nothing (its reply is always kept).
-- FLAGS: none: a full server (maxmemory) refuses it whole, before anything moves
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include counters
-- @include memo
-- @include meta
-- @include ready
-- @include settle

local k = {delayed = KEYS[1], meta = KEYS[2], payloads = KEYS[3], stats = KEYS[4],
  memo = KEYS[5], memo_exp = KEYS[6], levels = {}}
for i = 7, #KEYS do k.levels[#k.levels + 1] = KEYS[i] end
args_exactly(7)
local limit = int_arg(7, 'limit', 1)
local now = now_ms()
local earlier = earlier_reply(k.memo, k.memo_exp, now)
if earlier then return {tonumber(earlier[1]), tonumber(earlier[2])} end

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
local out = {promoted, redis.call('ZCARD', k.delayed) > 0 and 1 or 0}
remember(k.memo, k.memo_exp, out, now)
return out
