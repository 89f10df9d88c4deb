-- replay.lua: move dead letters back to the back of their ready lists with a fresh
-- delivery count.
--
-- KEYS: the common vector (lib/common.lua).
-- ARGV[6] limit         how many to replay when no ids are given (oldest first)
-- ARGV[7..] ids         the dead letters to replay; none = the oldest `limit`
-- Returns the number replayed (ids not in the dead-letter list are skipped).
-- @include common

local ids = {}
if #ARGV >= 7 then
  for i = 7, #ARGV do
    if redis.call('LREM', dead, 1, ARGV[i]) > 0 then ids[#ids + 1] = ARGV[i] end
  end
else
  local limit = tonumber(ARGV[6])
  while #ids < limit do
    local id = redis.call('RPOP', dead)
    if not id then break end
    ids[#ids + 1] = id
  end
end
local replayed = 0
for _, id in ipairs(ids) do
  local m = mkey(id)
  local entry = entry_of(id)
  if entry then
    redis.call('HSET', m, 'n', 0)
    redis.call('HDEL', m, 'e', 'd', 't')
    push_ready(id, entry, false)
    if inline then redis.call('DEL', m) end
    replayed = replayed + 1
  else
    redis.call('DEL', m)
  end
end
fix_door()
count('replayed', replayed)
return replayed
