-- recover.lua: the bounded recovery steps that every claim and every sweep runs.
-- `k` holds processing, leases, delayed, dead, meta, payloads, stats and levels.
-- @include context
-- @include copies
-- @include counters
-- @include ids
-- @include meta
-- @include ready
-- @include settle

-- Return up to `limit` expired leases. A claim that had started counts a run (and is
-- dead-lettered after max_deliveries); one that never started goes back uncounted. A
-- provisional lease (token '0': an entry BLMOVE-d by a claimer that vanished before its
-- lease) puts the entry back from the landing zone and counts a lost landing, so an entry
-- that kills every consumer that receives it is dead-lettered too. Inline, a provisional
-- copy whose entry is no longer in the landing zone (an identical entry's claimer took it
-- under another copy's record) is only forgotten: that entry is held already.
-- Returns reclaimed, dead-lettered, adopted.
local function sweep_expired(k, now, limit)
  local ids = redis.call('ZRANGEBYSCORE', k.leases, '-inf', now, 'LIMIT', 0, limit)
  local reclaimed, died, adopted = 0, 0, 0
  for _, id in ipairs(ids) do
    local m = meta_get(k.meta, id)
    if not m then
      redis.call('ZREM', k.leases, id)
      dead_letter(k, id, meta_new(1, 0), 'message state missing for a leased id', now)
      died = died + 1
    elseif m.t == '0' then
      redis.call('ZREM', k.leases, id)
      local entry = INLINE and redis.call('HGET', k.payloads, id) or id
      local landed = entry and redis.call('LREM', k.processing, -1, entry) > 0
      m.x = m.x + 1
      if INLINE and entry and not landed then
        forget_record(k, id)
        redis.call('HDEL', k.payloads, id)
      elseif m.x >= MAX_DELIVERIES then
        dead_letter(k, id, m, 'its consumers vanished between receiving it and leasing it ' ..
          m.x .. ' times (max_deliveries=' .. MAX_DELIVERIES .. ')', now)
        died = died + 1
      elseif to_ready(k, id, m, true) then
        adopted = adopted + 1
      end
    elseif send_back(k, id, m, now, 0, 'lease expired', true, false) == 'dead' then
      died = died + 1
    else
      reclaimed = reclaimed + 1
      emit(k, 'reclaimed', id, m, 'lease expired', now)
    end
  end
  count(k.stats, 'reclaimed', reclaimed)
  count(k.stats, 'adopted', adopted)
  return reclaimed, died, adopted
end

local function lease_provisionally(k, id, m, entry, now, grace_ms)
  m = m or meta_new(1, 0)
  m.t, m.s = '0', false
  meta_put(k.meta, id, m)
  if INLINE then redis.call('HSET', k.payloads, id, entry) end
  redis.call('ZADD', k.leases, now + grace_ms, id)
end

-- Inline: give the copies of `entry` (`plain` its id) that land `landed` times as many
-- provisional leases, reusing waiting copies' records first. Returns how many it gave.
local function adopt_copies(k, entry, plain, landed, now, grace_ms)
  local copies = copies_of(k, plain)
  local waiting, free = {}, {}
  for _, c in ipairs(copies) do
    if c.state == 'landing' then
      landed = landed - 1
    elseif c.state == 'waiting' then
      waiting[#waiting + 1] = c
    elseif c.state == 'free' then
      free[#free + 1] = c
    end
  end
  local given = 0
  for _, c in ipairs(waiting) do
    if landed <= 0 then return given end
    lease_provisionally(k, c.id, c.m, entry, now, grace_ms)
    landed, given = landed - 1, given + 1
  end
  for _, c in ipairs(free) do
    if landed <= 0 then return given end
    lease_provisionally(k, c.id, nil, entry, now, grace_ms)
    landed, given = landed - 1, given + 1
  end
  while landed > 0 do
    lease_provisionally(k, copy_next(k, plain, copies), nil, entry, now, grace_ms)
    landed, given = landed - 1, given + 1
  end
  return given
end

-- Give up to `limit` entries that sit in the landing zone with no lease (their claimer may
-- have died between BLMOVE and its lease) a provisional lease of `grace_ms`; the claimer's
-- own lease script takes it over if it arrives in time. Returns how many were found.
local function adopt_landing(k, now, limit, grace_ms)
  if redis.call('LLEN', k.processing) == 0 then return 0 end
  local found = 0
  local landed, order = {}, {}
  for _, entry in ipairs(redis.call('LRANGE', k.processing, -limit, -1)) do
    if entry == BELL then
      redis.call('LREM', k.processing, 0, BELL)
    elseif INLINE then
      if not landed[entry] then order[#order + 1] = entry end
      landed[entry] = (landed[entry] or 0) + 1
    elseif not redis.call('ZSCORE', k.leases, entry) then
      lease_provisionally(k, entry, meta_get(k.meta, entry), entry, now, grace_ms)
      found = found + 1
    end
  end
  for _, entry in ipairs(order) do
    found = found + adopt_copies(k, entry, id_of(entry), landed[entry], now, grace_ms)
  end
  count(k.stats, 'orphans_found', found)
  return found
end

-- Move up to `limit` due delayed messages to the back of their ready lists. Returns how
-- many, and the ms until the next delayed message is due afterwards (-1: none is delayed).
local function promote_due(k, now, limit)
  local first = redis.call('ZRANGE', k.delayed, 0, 0, 'WITHSCORES')
  if #first == 0 then return 0, -1 end
  local promoted = 0
  if tonumber(first[2]) <= now then
    local ids = redis.call('ZRANGEBYSCORE', k.delayed, '-inf', now, 'LIMIT', 0, limit)
    for _, id in ipairs(ids) do
      redis.call('ZREM', k.delayed, id)
      if to_ready(k, id, meta_get(k.meta, id) or meta_new(1, 0), false) then
        promoted = promoted + 1
      end
    end
    count(k.stats, 'promoted', promoted)
    first = redis.call('ZRANGE', k.delayed, 0, 0, 'WITHSCORES')
    if #first == 0 then return promoted, -1 end
  end
  return promoted, math.max(0, math.floor(tonumber(first[2]) - now))
end

-- The bounded recovery a claim runs before it claims: up to `limit` expired leases back,
-- landing entries given a provisional lease of `grace_ms`, due delayed messages promoted.
-- Returns the ms until the next delayed message is due (-1: none is delayed).
local function recover_bounded(k, now, limit, grace_ms)
  sweep_expired(k, now, limit)
  adopt_landing(k, now, limit, grace_ms)
  local _, next_due = promote_due(k, now, limit)
  return next_due
end
