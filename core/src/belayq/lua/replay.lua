-- replay.lua: move dead letters back to the back of their ready lists with fresh counts
-- (discard.lua deletes them).
--
-- KEYS[1] dead       zset id -> dead at
-- KEYS[2] meta       hash id -> state, trace contexts
-- KEYS[3] payloads   hash id -> payload
-- KEYS[4] stats      hash of counters
-- KEYS[5] memo       hash: this call's reply, for a re-sent call
-- KEYS[6] memo_exp   zset memo field -> expiry
-- KEYS[7..] levels   ready lists, highest priority first
-- ARGV[1..6]         see includes/context.lua
-- ARGV[7] limit      how many to replay when no ids are given (oldest first)
-- ARGV[8..] ids      the dead letters to replay; none = the oldest `limit`
-- Returns the number replayed (ids not in the dead-letter set are skipped). A call re-sent
-- with the same request id answers as its first run did and moves nothing more, even when
-- the first run moved nothing and dead letters arrived since (its reply is always kept).
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

local k = {dead = KEYS[1], meta = KEYS[2], payloads = KEYS[3], stats = KEYS[4], memo = KEYS[5],
  memo_exp = KEYS[6], levels = {}}
for i = 7, #KEYS do k.levels[#k.levels + 1] = KEYS[i] end

local limit = int_arg(7, 'limit', 1)
for i = 8, #ARGV do text_arg(i, 'id') end

local now = now_ms()
local earlier = earlier_reply(k.memo, k.memo_exp, now)
if earlier then return tonumber(earlier[1]) end

-- The dead letters to replay, and their state, are read before anything is written.
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
  local oldest = redis.call('ZRANGE', k.dead, 0, limit - 1)
  for i = 1, #oldest do ids[#ids + 1] = oldest[i] end
end
if #ids == 0 then
  remember(k.memo, k.memo_exp, {0}, now)
  return 0
end

local metas, found = {}, {}
for j, id in ipairs(ids) do
  metas[j] = meta_get(k.meta, id) or meta_new(1, 0)
  found[j] = INLINE or redis.call('HEXISTS', k.payloads, id) == 1
end

local replayed = 0
for j, id in ipairs(ids) do
  redis.call('ZREM', k.dead, id)
  local m = metas[j]
  m.n, m.a, m.x, m.d, m.e = 0, 0, 0, 0, ''
  if found[j] and to_ready(k, id, m, false) then
    replayed = replayed + 1
  else
    forget_record(k, id)
    redis.call('HDEL', k.meta, context_field(id))
  end
end
fix_door(k.levels)
count(k.stats, 'replayed', replayed)
remember(k.memo, k.memo_exp, {replayed}, now)
return replayed
