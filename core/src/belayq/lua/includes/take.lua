-- take.lua: register the leases of entries taken off a ready list or out of the landing zone.
-- @include context
-- @include copies
-- @include counters
-- @include ids
-- @include meta
-- @include ready
-- @include settle

-- Record in `m` that the message is leased to the claim `token`, from level `lvl`;
-- `starts`: the claim counts as a started attempt at once.
local function lease_record(m, lvl, token, starts)
  m.l, m.n, m.t, m.s = lvl, m.n + 1, token, starts
  if starts then m.a = m.a + 1 end
end

-- An entry whose message another claim holds (an id list that held it twice, or two
-- identical ids in one pop): it is dropped.
local function held_elsewhere(m)
  return m and m.t ~= '' and m.t ~= '0'
end

-- A message that cannot be delivered: its payload is gone. It is dead-lettered.
local function payload_gone(k, id, m, now)
  redis.call('ZREM', k.leases, id)
  dead_letter(k, id, m, 'payload missing for id', now)
  count(k.stats, 'malformed', 1)
end

-- Inline mode: lease entry `entry` (see take). Each identical entry is its own message
-- (includes/copies.lua), so entries are taken one by one.
local function take_inline(k, entry, lvl, now, deadline, token, starts, landing)
  local id, m = copy_taken(k, id_of(entry), landing)
  if not id then
    count(k.stats, 'duplicates_dropped', 1)
    return nil
  end
  m = m or meta_new(lvl, 0)
  lease_record(m, lvl, token, starts)
  redis.call('HSET', k.payloads, id, entry)
  meta_put(k.meta, id, m)
  redis.call('ZADD', k.leases, deadline, id)
  return {id, entry, token, m.n, m.a}
end

-- Id mode: an id pushed again by hand while it is dead is resubmitted, as replay_dead
-- would do, and its dead letter goes (one id cannot be in two states). Returns its record.
local function revived(k, id, m)
  if m and m.d > 0 and redis.call('ZSCORE', k.dead, id) then
    redis.call('ZREM', k.dead, id)
    count(k.stats, 'resubmitted', 1)
    return nil
  end
  return m
end

-- Lease the entries `entries` (bells among them are skipped), taken off level `lvl` (or,
-- `landing`, out of the landing zone), until now + lease_ms; each claim's token is `nonce`
-- and the number of values in `out` at its turn, so no rollback of the server can hand out
-- a token twice. Appends each delivery {id, payload, token, deliveries, attempts} to `out`.
-- An entry with nothing to deliver is left out: a message another claim holds (dropped) or
-- one whose payload is gone (dead-lettered). In id mode the states are read in one HMGET
-- each and the leases written in one HSET and one ZADD. Returns how many were leased.
local function take(k, out, entries, lvl, now, lease_ms, nonce, starts, landing)
  local deadline = int(now + lease_ms)
  local got = 0
  if INLINE then
    for _, entry in ipairs(entries) do
      local d = entry ~= BELL and
        take_inline(k, entry, lvl, now, deadline, nonce .. #out, starts, landing)
      if d then
        for _, v in ipairs(d) do out[#out + 1] = v end
        got = got + 1
      end
    end
    count(k.stats, 'claimed', got)
    return got
  end
  local ids = entries
  for i, entry in ipairs(entries) do
    if entry == BELL then  -- rare: copy the others
      ids = {unpack(entries, 1, i - 1)}
      for j = i + 1, #entries do
        if entries[j] ~= BELL then ids[#ids + 1] = entries[j] end
      end
      if #ids == 0 then return 0 end
      break
    end
  end
  local packed, payloads
  if #ids == 1 then  -- HGET answers a single field faster than HMGET
    packed = {redis.call('HGET', k.meta, ids[1])}
    payloads = {redis.call('HGET', k.payloads, ids[1])}
  else
    packed = redis.call('HMGET', k.meta, unpack(ids))
    payloads = redis.call('HMGET', k.payloads, unpack(ids))
  end
  local metas, leases, dropped = {}, {}, 0
  local seen = #ids > 1 and {} or false
  for i, id in ipairs(ids) do
    local m = packed[i] and meta_parse(packed[i])
    if (seen and seen[id]) or held_elsewhere(m) then
      dropped = dropped + 1
    else
      if seen then seen[id] = true end
      m = revived(k, id, m) or meta_new(lvl, 0)
      if not payloads[i] then
        payload_gone(k, id, m, now)
      else
        local token = nonce .. #out
        lease_record(m, lvl, token, starts)
        metas[#metas + 1] = id
        metas[#metas + 1] = meta_text(m)
        leases[#leases + 1] = deadline
        leases[#leases + 1] = id
        out[#out + 1] = id
        out[#out + 1] = payloads[i]
        out[#out + 1] = token
        out[#out + 1] = m.n
        out[#out + 1] = m.a
        got = got + 1
      end
    end
  end
  if got > 0 then
    redis.call('HSET', k.meta, unpack(metas))
    redis.call('ZADD', k.leases, unpack(leases))
  end
  count(k.stats, 'duplicates_dropped', dropped)
  count(k.stats, 'claimed', got)
  return got
end
