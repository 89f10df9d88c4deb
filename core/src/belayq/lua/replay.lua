-- replay.lua: move dead letters back to the back of their ready lists with fresh counts.
--
-- KEYS[1] dead       zset id -> dead at
-- KEYS[2] meta       hash id -> state
-- KEYS[3] payloads   hash id -> payload
-- KEYS[4] stats      hash of counters
-- KEYS[5..] levels   ready lists, highest priority first
-- ARGV[1..6]         see includes/context.lua
-- ARGV[7] limit      how many to replay when no ids are given (oldest first)
-- ARGV[8..] ids      the dead letters to replay; none = the oldest `limit`
-- Returns the number replayed (ids not in the dead-letter set are skipped).
-- @include context
-- @include counters
-- @include meta
-- @include ready
-- @include settle

local k = {dead = KEYS[1], meta = KEYS[2], payloads = KEYS[3], stats = KEYS[4], levels = {}}
for i = 5, #KEYS do k.levels[#k.levels + 1] = KEYS[i] end

local ids = {}
if #ARGV >= 8 then
  for i = 8, #ARGV do
    if redis.call('ZREM', k.dead, ARGV[i]) > 0 then ids[#ids + 1] = ARGV[i] end
  end
else
  local popped = redis.call('ZPOPMIN', k.dead, tonumber(ARGV[7]))
  for i = 1, #popped, 2 do ids[#ids + 1] = popped[i] end
end
local replayed = 0
for _, id in ipairs(ids) do
  local m = meta_get(k.meta, id) or meta_new(1, 0)
  m.n, m.a, m.x, m.d, m.e = 0, 0, 0, 0, ''
  if (INLINE or redis.call('HEXISTS', k.payloads, id) == 1) and to_ready(k, id, m, false) then
    replayed = replayed + 1
  else
    redis.call('HDEL', k.meta, id)
  end
end
fix_door(k.levels)
count(k.stats, 'replayed', replayed)
return replayed
