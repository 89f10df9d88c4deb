-- drop.lua: delete a queue that holds no claimed message: its waiting messages, its dead
-- letters and every key of its own (counters too). A queue with claims in flight is left
-- as it is, since their tokens come from its counters (a new sequence could fence wrong).
--
-- KEYS: the common vector (lib/common.lua).
-- Returns 1 when dropped, 0 when claims are in flight.
-- @include common

if redis.call('LLEN', processing) > 0 or redis.call('ZCARD', leases) > 0 then
  return 0
end
for _, list in ipairs(levels) do
  for _, entry in ipairs(redis.call('LRANGE', list, 0, -1)) do
    if entry ~= BELL then redis.call('DEL', mkey(id_of(entry))) end
  end
end
for _, id in ipairs(redis.call('ZRANGE', delayed, 0, -1)) do
  redis.call('DEL', mkey(id))
end
for _, id in ipairs(redis.call('LRANGE', dead, 0, -1)) do
  redis.call('DEL', mkey(id))
end
redis.call('DEL', processing, leases, delayed, dead, stats, guard, unpack(levels))
return 1
