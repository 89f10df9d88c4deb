-- discard.lua: delete dead letters (payload, record, trace context): those named, or the
-- oldest `limit`.
--
-- KEYS[1] dead       zset id -> dead at
-- KEYS[2] meta       hash id -> state, trace contexts
-- KEYS[3] payloads   hash id -> payload
-- KEYS[4] stats      hash of counters
-- KEYS[5] memo       hash: this call's reply, for a re-sent call
-- KEYS[6] memo_exp   zset memo field -> expiry
-- ARGV[1..6]         see includes/context.lua
-- ARGV[7] limit      how many to delete when no ids are given (oldest first)
-- ARGV[8..] ids      the dead letters to delete; none = the oldest `limit`
-- Returns the number deleted (ids not in the dead-letter set are skipped). A call re-sent
-- with the same request id answers as its first run did and deletes nothing more, even when
-- the first run deleted nothing and dead letters arrived since (its reply is always kept).
-- FLAGS: allow-oom (a full server still runs it: it frees memory)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include counters
-- @include memo
-- @include copies
-- @include meta

local k = {dead = KEYS[1], meta = KEYS[2], payloads = KEYS[3], stats = KEYS[4], memo = KEYS[5],
  memo_exp = KEYS[6]}
local limit = int_arg(7, 'limit', 1)
for i = 8, #ARGV do text_arg(i, 'id') end

local now = now_ms()
local earlier = earlier_reply(k.memo, k.memo_exp, now)
if earlier then return tonumber(earlier[1]) end

-- The dead letters to delete are read before anything is written.
local ids, seen = {}, {}
if #ARGV >= 8 then
  for i = 8, #ARGV do
    local id = ARGV[i]
    if not seen[id] and redis.call('ZSCORE', k.dead, id) then
      seen[id] = true
      ids[#ids + 1] = id
    end
  end
else
  ids = redis.call('ZRANGE', k.dead, 0, limit - 1)
end
if #ids == 0 then
  remember(k.memo, k.memo_exp, {0}, now)
  return 0
end

for _, id in ipairs(ids) do
  redis.call('ZREM', k.dead, id)
  redis.call('HDEL', k.payloads, id)
  redis.call('HDEL', k.meta, context_field(id))
  forget_record(k, id)
end
count(k.stats, 'discarded', #ids)
remember(k.memo, k.memo_exp, {#ids}, now)
return #ids
