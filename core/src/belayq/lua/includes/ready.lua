-- ready.lua: the ready lists (highest priority first) and the bell.
-- The head is the end claims take from: 'front' pushes go there, publishes to the tail.
-- @include context
-- @include counters

-- A bell wakes blocked claimers when work sits only in lower levels (see fix_door).
local BELL = '\0belayq:bell'

local function push_head(list, value)
  if HEAD_LEFT then return redis.call('LPUSH', list, value) end
  return redis.call('RPUSH', list, value)
end

local function push_tail(list, value)
  if HEAD_LEFT then return redis.call('RPUSH', list, value) end
  return redis.call('LPUSH', list, value)
end

local function pop_head(list)
  return redis.call(HEAD_LEFT and 'LPOP' or 'RPOP', list)
end

-- Up to n entries off the head of `list`, head first; an empty table when it is empty.
local function pop_head_n(list, n)
  if n == 1 then
    local entry = pop_head(list)
    return entry and {entry} or {}
  end
  return redis.call(HEAD_LEFT and 'LPOP' or 'RPOP', list, n) or {}
end

local function level_in(levels, l)
  if l < 1 then return 1 end
  if l > #levels then return #levels end
  return l
end

-- Keep "level 1 empty => nothing ready anywhere" true for blocked claimers (BLMOVE watches
-- level 1 only): when level 1 is empty but a lower level holds work, ring the bell in
-- level 1. At most one bell exists, since it is rung only into an empty list. With the bell
-- off (mode 'N') blocked claimers time out every sweep period and look.
local function fix_door(levels)
  if not BELL_ON or #levels < 2 or redis.call('LLEN', levels[1]) > 0 then return end
  for i = 2, #levels do
    if redis.call('LLEN', levels[i]) > 0 then
      push_head(levels[1], BELL)
      return
    end
  end
end

-- Which level the next claim takes from: the highest-priority non-empty one, except that
-- every floor_every-th claim takes the lowest non-empty one (the starvation floor). Bells
-- met on the way are discarded. Returns nil, writing nothing, when all are empty.
local function pick_level(levels, stats, floor_every)
  if #levels == 1 then return 1 end  -- no bells without lower levels; the pop tells if empty
  local top = nil
  for i = 1, #levels do
    local n = redis.call('LLEN', levels[i])
    if n > 0 and i == 1 and redis.call('LINDEX', levels[1], HEAD_LEFT and 0 or -1) == BELL then
      pop_head(levels[1])
      n = n - 1
    end
    if n > 0 then
      top = i
      break
    end
  end
  if not top or floor_every <= 0 or TRANSIENT then return top end
  count(stats, 'floor_seq', 1)
  if tonumber(redis.call('HGET', stats, 'floor_seq')) % floor_every == 0 then
    for i = #levels, top + 1, -1 do
      if redis.call('LLEN', levels[i]) > 0 then return i end
    end
  end
  return top
end
