-- purge.lua: delete every waiting message (ready and delayed) with its hash. Claimed
-- messages and dead letters are not touched.
--
-- KEYS: the common vector (lib/common.lua).
-- Returns the number of messages deleted.
-- @include common

local purged = 0
for _, list in ipairs(levels) do
  for _, entry in ipairs(redis.call('LRANGE', list, 0, -1)) do
    if entry ~= BELL then
      purged = purged + 1
      redis.call('DEL', mkey(id_of(entry)))
    end
  end
  redis.call('DEL', list)
end
for _, id in ipairs(redis.call('ZRANGE', delayed, 0, -1)) do
  redis.call('DEL', mkey(id))
  purged = purged + 1
end
redis.call('DEL', delayed)
count('purged', purged)
return purged
