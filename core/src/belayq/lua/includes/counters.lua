-- counters.lua: the queue's counters (stats hash). A counter's first increment also stamps
-- the key schema version (so the stamp costs nothing in the steady state), and a queue that
-- nothing ever wrote to has no stats key at all.
-- @include context

local SCHEMA = '2'

local function count(stats, field, by)
  if by == 0 or TRANSIENT then return end
  if redis.call('HINCRBY', stats, field, by) == by then
    redis.call('HSETNX', stats, 'schema', SCHEMA)
  end
end
