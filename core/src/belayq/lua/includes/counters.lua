-- counters.lua: the queue's counters (stats hash). The first count of a call also stamps
-- the key schema version, so a queue that nothing ever wrote to has no stats key at all.
-- @include context

local SCHEMA = '2'
local stamped = false

local function count(stats, field, by)
  if by == 0 then return end
  if not stamped then
    redis.call('HSETNX', stats, 'schema', SCHEMA)
    stamped = true
  end
  redis.call('HINCRBY', stats, field, by)
end
