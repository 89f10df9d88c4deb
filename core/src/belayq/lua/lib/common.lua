-- common.lua: included at the top of every belayq script (scripts.py pastes it in).
--
-- KEYS, the same vector for every script (all on one cluster slot):
--   KEYS[1]  processing  list of claimed entries (BLMOVE/LMOVE destination)
--   KEYS[2]  leases      zset id -> lease deadline (ms, server clock)
--   KEYS[3]  delayed     zset id -> due time (ms, server clock)
--   KEYS[4]  dead        list of dead-lettered ids, newest at the head
--   KEYS[5]  stats       hash: counters, 'seq' (token sequence), 'schema'
--   KEYS[6]  guard       string: the fleet-wide sweep guard (SET NX PX)
--   KEYS[7..] levels     ready lists, highest priority first; KEYS[7] is the BLMOVE source
-- Per-message hashes '<base>m:<id>' and dedup keys '<base>dedup:<dedup id>' are derived
-- from KEYS[1] ('<base>processing'), so they share its hash tag and slot.
--
-- ARGV, the same first five for every script:
--   ARGV[1]  skew_ms         added to the server clock; 0 except in tests that move time
--   ARGV[2]  mode            first char '1': list entries are the payloads themselves (id =
--                            sha1 of the entry); '0': entries are ids, payloads live in the
--                            message hash. Flags after it: 'L' the head of the ready lists
--                            (claimed next) is their LEFT end, as RQ's (producers RPUSH);
--                            otherwise it is the RIGHT end, as kombu's (producers LPUSH).
--                            'N' never ring the bell (lists shared with stock consumers)
--   ARGV[3]  max_deliveries  deliveries after which a failed message is dead-lettered
--   ARGV[4]  dead_max        cap of the dead-letter list
--   ARGV[5]  request_id      '' or an id the client gives a non-idempotent call (publish,
--                            claim, lease, ack, nack, release); the reply is kept for
--                            REPLY_TTL_MS under '<base>r:<request id>' so that a re-sent
--                            call (redis-py retries after a dropped connection) gets the
--                            first reply instead of running twice
-- Script-specific arguments start at ARGV[6].
--
-- Message hash fields: p payload (in inline mode: the list entry), l level (1-based),
-- n deliveries, t token of the current claim ('0' = provisional lease of the sweep),
-- u published at (ms), e last error, d dead-lettered at (ms).

local processing = KEYS[1]
local leases = KEYS[2]
local delayed = KEYS[3]
local dead = KEYS[4]
local stats = KEYS[5]
local guard = KEYS[6]
local levels = {}
for i = 7, #KEYS do levels[#levels + 1] = KEYS[i] end
local base = string.sub(processing, 1, -11)

local skew_ms = tonumber(ARGV[1])
local inline = string.sub(ARGV[2], 1, 1) == '1'
local HEAD = string.find(ARGV[2], 'L', 2, true) and 'LEFT' or 'RIGHT'
local BELL_ON = not string.find(ARGV[2], 'N', 2, true)
local max_deliveries = tonumber(ARGV[3])
local dead_max = tonumber(ARGV[4])
local request_id = ARGV[5]
local REPLY_TTL_MS = 15000

-- A bell wakes blocked claimers when work sits only in lower levels (see fix_door).
local BELL = '\0belayq:bell'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + skew_ms
end

local function mkey(id)
  return base .. 'm:' .. id
end

-- Short printable-ASCII entries (RQ job ids) are their own id; long ones (kombu envelopes)
-- and any holding other bytes (binary or non-ASCII garbage pushed by another program) go by
-- digest, so every id survives the trip through a client as text and settles its message.
-- fakeredis has no redis.sha1hex, so it gets a weaker polynomial digest instead.
local function digest(s)
  if redis.sha1hex then return redis.sha1hex(s) end
  local a, b = 7, 11
  for i = 1, #s do
    local c = string.byte(s, i)
    a = (a * 257 + c) % 2147483647
    b = (b * 263 + c) % 2147483629
  end
  return string.format('x%08x%08x%x', a, b, #s)
end

local function id_of(entry)
  if inline and (#entry > 64 or #entry == 0 or string.find(entry, '[^!-~]')) then
    return digest(entry)
  end
  return entry
end

local function entry_of(id)
  if inline then return redis.call('HGET', mkey(id), 'p') end
  return id
end

local function level_of(id)
  local l = tonumber(redis.call('HGET', mkey(id), 'l') or '1') or 1
  if l < 1 then return 1 end
  if l > #levels then return #levels end
  return l
end

-- The head is the end claims take from: 'front' pushes go there, publishes to the tail.
local function push_head(list, value)
  if HEAD == 'LEFT' then return redis.call('LPUSH', list, value) end
  return redis.call('RPUSH', list, value)
end

local function push_tail(list, value)
  if HEAD == 'LEFT' then return redis.call('RPUSH', list, value) end
  return redis.call('LPUSH', list, value)
end

local function head_of(list)
  return redis.call('LINDEX', list, HEAD == 'LEFT' and 0 or -1)
end

local function count(field, by)
  if by ~= 0 then redis.call('HINCRBY', stats, field, by) end
end

-- Replies are kept as length-prefixed strings: '<len>:<bytes>' per element.
local function pack(t)
  local parts = {}
  for i, v in ipairs(t) do
    v = tostring(v)
    parts[i] = #v .. ':' .. v
  end
  return table.concat(parts)
end

local function unpack_reply(s)
  local out, pos = {}, 1
  while pos <= #s do
    local colon = string.find(s, ':', pos, true)
    local n = tonumber(string.sub(s, pos, colon - 1))
    out[#out + 1] = string.sub(s, colon + 1, colon + n)
    pos = colon + n + 1
  end
  return out
end

-- The reply of an earlier run of this very request, or nil.
local function earlier_reply()
  if request_id == '' then return nil end
  local s = redis.call('GET', base .. 'r:' .. request_id)
  if not s then return nil end
  count('repeated_requests', 1)
  return unpack_reply(s)
end

local function remember(reply)
  if request_id ~= '' then
    redis.call('SET', base .. 'r:' .. request_id, pack(reply), 'PX', REPLY_TTL_MS)
  end
  return reply
end

-- Claim replies are {header..., id, payload, token, deliveries, ...}; they are kept
-- without payloads, which a repeat reads back from the message hashes (a claim no longer
-- held under that token is left out).
local function remember_claim(out, header)
  if request_id == '' then return out end
  local kept = {}
  for i = 1, header do kept[i] = out[i] end
  for i = header + 1, #out, 4 do
    kept[#kept + 1] = out[i]
    kept[#kept + 1] = out[i + 2]
    kept[#kept + 1] = out[i + 3]
  end
  remember(kept)
  return out
end

local function replay_claim(kept, header)
  local out = {}
  for i = 1, header do out[i] = tonumber(kept[i]) end
  for i = header + 1, #kept, 3 do
    local id, token = kept[i], kept[i + 1]
    local held = redis.call('HMGET', base .. 'm:' .. id, 't', 'p')
    if held[1] == token and held[2] then
      out[#out + 1] = id
      out[#out + 1] = held[2]
      out[#out + 1] = token
      out[#out + 1] = tonumber(kept[i + 2])
    end
  end
  return out
end

-- Keep "level 1 empty => nothing ready anywhere" true for blocked claimers: when level 1
-- is empty but a lower level holds work, ring the bell in level 1 so a BLMOVE wakes up
-- and claims by priority. At most one bell exists, since it is rung only into an empty list.
-- With the bell off (mode 'N') blocked claimers time out every sweep period and look.
local function fix_door()
  if not BELL_ON or #levels < 2 or redis.call('LLEN', levels[1]) > 0 then return end
  for i = 2, #levels do
    if redis.call('LLEN', levels[i]) > 0 then
      push_head(levels[1], BELL)
      return
    end
  end
end

-- Put an entry back on its ready list: front = next to be claimed (at the head).
local function push_ready(id, entry, front)
  local lvl = level_of(id)
  if front then
    push_head(levels[lvl], entry)
  else
    push_tail(levels[lvl], entry)
  end
end

local function dead_letter(id, reason, now)
  local m = mkey(id)
  redis.call('HSET', m, 'e', reason, 'd', now)
  redis.call('HDEL', m, 't')
  redis.call('PERSIST', m)
  redis.call('LPUSH', dead, id)
  count('dead_lettered', 1)
  while redis.call('LLEN', dead) > dead_max do
    local old = redis.call('RPOP', dead)
    redis.call('DEL', mkey(old))
    count('dead_dropped', 1)
  end
end

-- Settle a message that left processing without an ack: dead-letter it after
-- max_deliveries (unless provisional), delay it, or put it back on its ready list.
-- Returns 'dead', 'delayed' or 'ready'.
local function send_back(id, entry, now, delay_ms, reason, front, may_die)
  local m = mkey(id)
  redis.call('ZREM', leases, id)
  redis.call('HDEL', m, 't')
  if reason and reason ~= '' then redis.call('HSET', m, 'e', reason) end
  local n = tonumber(redis.call('HGET', m, 'n') or '0') or 0
  if may_die and n >= max_deliveries then
    local why = (reason and reason ~= '') and reason or 'failed'
    dead_letter(id, why .. ' (delivered ' .. n .. ' times, max_deliveries=' ..
      max_deliveries .. ')', now)
    return 'dead'
  end
  if inline and entry then redis.call('HSET', m, 'p', entry) end
  if delay_ms > 0 then
    redis.call('ZADD', delayed, now + delay_ms, id)
    return 'delayed'
  end
  push_ready(id, entry or id, front)
  if inline and n == 0 then redis.call('DEL', m) end
  return 'ready'
end

-- Return up to `limit` expired leases to the front of their ready lists.
-- Returns reclaimed, dead-lettered, adopted (provisional leases that expired).
local function sweep_expired(now, limit)
  local ids = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, limit)
  local reclaimed, died, adopted = 0, 0, 0
  for _, id in ipairs(ids) do
    local m = mkey(id)
    local token = redis.call('HGET', m, 't')
    local entry = entry_of(id)
    if not entry then
      redis.call('ZREM', leases, id)
      if not inline then redis.call('LREM', processing, -1, id) end
      dead_letter(id, 'message hash missing for a leased id', now)
      died = died + 1
    else
      redis.call('LREM', processing, -1, entry)
      if token == '0' then
        send_back(id, entry, now, 0, nil, true, false)
        adopted = adopted + 1
      elseif send_back(id, entry, now, 0, 'lease expired', true, true) == 'dead' then
        died = died + 1
      else
        reclaimed = reclaimed + 1
      end
    end
  end
  count('reclaimed', reclaimed)
  count('adopted', adopted)
  return reclaimed, died, adopted
end

-- Move up to `limit` due delayed messages to the back of their ready lists.
local function promote_due(now, limit)
  local ids = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, limit)
  local promoted = 0
  for _, id in ipairs(ids) do
    redis.call('ZREM', delayed, id)
    local entry = entry_of(id)
    if entry then
      push_ready(id, entry, false)
      if inline and tonumber(redis.call('HGET', mkey(id), 'n') or '0') == 0 then
        redis.call('DEL', mkey(id))
      end
      promoted = promoted + 1
    end
  end
  count('promoted', promoted)
  return promoted
end

-- Register the lease of an entry that now sits in processing. Returns the delivery
-- {id, payload, token, deliveries}, or nil when the entry cannot be delivered (its
-- message hash is missing: dead-lettered; an identical copy is already leased: dropped).
local function lease_entry(entry, lvl, now, lease_ms)
  local id = id_of(entry)
  local m = mkey(id)
  local held = redis.call('HMGET', m, 't', 'p')
  local current = held[1]
  if current and current ~= '0' then
    -- Already leased. A second copy of the entry sits in processing only when the list
    -- held it twice; otherwise this claimer lost its entry to the sweep and the one in
    -- processing is the current holder's.
    if #redis.call('LPOS', processing, entry, 'COUNT', 2) > 1 then
      redis.call('LREM', processing, 1, entry)
      count('duplicates_dropped', 1)
    else
      count('lost_claims', 1)
    end
    return nil
  end
  local payload = entry
  if inline then
    if redis.call('EXISTS', m) == 0 then redis.call('HSET', m, 'l', lvl) end
    redis.call('HSET', m, 'p', entry)
    redis.call('PERSIST', m)
  else
    payload = held[2]
    if not payload then
      redis.call('LREM', processing, 1, entry)
      redis.call('ZREM', leases, id)
      dead_letter(id, 'payload hash missing for id', now)
      count('malformed', 1)
      return nil
    end
  end
  local n = redis.call('HINCRBY', m, 'n', 1)
  local token = tostring(redis.call('HINCRBY', stats, 'seq', 1))
  redis.call('HSET', m, 't', token)
  redis.call('ZADD', leases, now + lease_ms, id)
  count('claimed', 1)
  return {id, payload, token, n}
end

-- Which level the next claim takes from: the highest-priority non-empty one, except that
-- every floor_every-th claim takes the lowest non-empty one (the starvation floor).
-- Bells met on the way are discarded. Returns nil, writing nothing, when all are empty.
local function pick_level(floor_every)
  if #levels == 1 then return 1 end  -- no bells without lower levels; LMOVE tells if empty
  local top = nil
  for i = 1, #levels do
    while head_of(levels[i]) == BELL do
      redis.call(HEAD == 'LEFT' and 'LPOP' or 'RPOP', levels[i])
    end
    if redis.call('LLEN', levels[i]) > 0 then
      top = i
      break
    end
  end
  if not top or floor_every <= 0 then return top end
  if redis.call('HINCRBY', stats, 'floor_seq', 1) % floor_every == 0 then
    for i = #levels, top + 1, -1 do
      if redis.call('LLEN', levels[i]) > 0 then return i end
    end
  end
  return top
end

-- Claim up to `n` ready entries into processing with leases; appends to `out`.
local function claim_ready(n, now, lease_ms, floor_every, out)
  local got = 0
  local attempts = 0
  while got < n and attempts < n + 64 do
    attempts = attempts + 1
    local lvl = pick_level(floor_every)
    if not lvl then break end
    local entry = redis.call('LMOVE', levels[lvl], processing, HEAD, 'LEFT')
    if not entry then break end
    if entry == BELL then
      redis.call('LREM', processing, 1, BELL)
    else
      local d = lease_entry(entry, lvl, now, lease_ms)
      if d then
        for _, v in ipairs(d) do out[#out + 1] = v end
        got = got + 1
      end
    end
  end
  return got
end

-- Milliseconds until the next delayed message is due, or -1 when none is delayed.
local function next_due_in(now)
  local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  if #first == 0 then return -1 end
  local wait = tonumber(first[2]) - now
  if wait < 0 then return 0 end
  return math.floor(wait)
end
