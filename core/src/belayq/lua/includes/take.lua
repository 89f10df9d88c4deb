-- take.lua: register the lease of an entry taken off a ready list or out of the landing zone.
-- @include context
-- @include copies
-- @include counters
-- @include ids
-- @include meta
-- @include settle

-- Lease entry `entry`, taken off level `lvl` (or out of the landing zone: `landing`), to the
-- claim `token` until now + lease_ms; `starts`: the claim counts as a started attempt at
-- once. Inline, each identical entry is its own message (includes/copies.lua). Returns the
-- delivery {id, payload, token, deliveries, attempts}, or nil when there is nothing to
-- deliver: an id whose message is already held (an id list that held it twice: this entry
-- is dropped), or an id whose payload is gone (dead-lettered).
local function take(k, entry, lvl, now, lease_ms, token, starts, landing)
  local id, m
  if INLINE then
    id, m = copy_taken(k, id_of(entry), landing)
    if not id then
      count(k.stats, 'duplicates_dropped', 1)
      return nil
    end
  else
    id = entry
    m = meta_get(k.meta, id)
    if m and m.t ~= '' and m.t ~= '0' then
      count(k.stats, 'duplicates_dropped', 1)
      return nil
    end
    if m and m.d > 0 and redis.call('ZSCORE', k.dead, id) then
      -- An id pushed again by hand while it is dead: it is resubmitted, as replay_dead
      -- would do, and its dead letter goes (one id cannot be in two states).
      redis.call('ZREM', k.dead, id)
      m = nil
      count(k.stats, 'resubmitted', 1)
    end
  end
  m = m or meta_new(lvl, 0)
  m.l = lvl
  local payload = entry
  if INLINE then
    redis.call('HSET', k.payloads, id, entry)
  else
    payload = redis.call('HGET', k.payloads, id)
    if not payload then
      redis.call('ZREM', k.leases, id)
      dead_letter(k, id, m, 'payload missing for id', now)
      count(k.stats, 'malformed', 1)
      return nil
    end
  end
  m.n, m.t, m.s = m.n + 1, token, starts
  if starts then m.a = m.a + 1 end
  meta_put(k.meta, id, m)
  redis.call('ZADD', k.leases, now + lease_ms, id)
  count(k.stats, 'claimed', 1)
  return {id, payload, token, m.n, m.a}
end
