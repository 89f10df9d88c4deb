-- claiming.lua: claim ready entries inside a script (no landing), and the replies of claims.
-- @include context
-- @include counters
-- @include ids
-- @include meta
-- @include memo
-- @include ready
-- @include take

-- The arguments of claim.lua and lease.lua (ARGV[7..12], described in claim.lua), checked;
-- `total` is how many arguments the script takes in all.
local function claim_args(total)
  args_exactly(total)
  return {lease_ms = int_arg(7, 'lease_ms', 1), want = int_arg(8, 'count', 1),
    floor_every = int_arg(9, 'floor_every', 0), sweep_limit = int_arg(10, 'sweep_limit', 1),
    nonce = text_arg(11, 'nonce'), starts = flag_arg(12, 'starts')}
end

-- The nonce a claim made at `now` builds its tokens from: the caller's nonce, '@', `now`
-- (ms, the server's clock) and a dot; each token then ends with the delivery's position in
-- the reply. So a lease's record tells when its claim was made (how long it has run), with
-- nothing more stored; a re-sent claim answers with the tokens of its first run (the memo
-- keeps this nonce).
local function claim_nonce(nonce, now)
  return nonce .. '@' .. int(now) .. '.'
end

-- The next_due_ms a claim answers while its queue is paused (see pause.lua).
local PAUSED = -2

-- Whether the queue is paused: the 'paused' field of its stats hash (pause.lua), which a
-- transient queue keeps too.
local function is_paused(k)
  return redis.call('HGET', k.stats, 'paused') ~= false
end

-- A paused queue hands an entry a blocking claim took (out of the landing zone) back to the
-- head of the first ready list, as if it had never been claimed: leased (which takes over a
-- provisional lease the sweep may have given it, and an identical entry's record) and
-- released at once, its delivery and its claim uncounted. Returns how many were handed back.
local function hand_back(k, entry, now, lease_ms, nonce)
  local got = {}
  take(k, got, {entry}, 1, now, lease_ms, nonce, false, true)
  for i = #got - 4, 1, -5 do
    local id = got[i]
    local m = meta_get(k.meta, id)
    m.n = math.max(0, m.n - 1)
    redis.call('ZREM', k.leases, id)
    to_ready(k, id, m, true)
  end
  local n = #got / 5
  if n > 0 and not TRANSIENT and
      redis.call('HINCRBY', k.stats, 'claimed', -n) == 0 then
    redis.call('HDEL', k.stats, 'claimed')  -- as if never counted
  end
  return n
end

-- How many entries one pop takes at most (Lua unpacks a bounded number of values at once).
local POP_MAX = 1000

-- Claim up to `want` ready entries with leases, appending the deliveries to `out` (see
-- take). Returns how many.
--
-- With the starvation floor on, each claim picks its level (pick_level). Else the levels
-- are popped in order, each for as many entries as are still wanted: a level that gives
-- fewer is empty, and a bell met on the way is dropped (fix_door rings again if needed).
local function claim_ready(k, want, now, lease_ms, floor_every, nonce, starts, out)
  local got, tries = 0, 0
  if floor_every > 0 and not TRANSIENT and #k.levels > 1 then
    while got < want and tries < want + 64 do
      tries = tries + 1
      local lvl = pick_level(k.levels, k.stats, floor_every)
      if not lvl then break end
      local entry = pop_head(k.levels[lvl])
      if not entry then break end
      got = got + take(k, out, {entry}, lvl, now, lease_ms, nonce, starts, false)
    end
    return got
  end
  local lvl = 1
  while got < want and lvl <= #k.levels and tries < want + 64 do
    local asked = math.min(want - got, POP_MAX)
    local entries = pop_head_n(k.levels[lvl], asked)
    tries = tries + #entries
    if #entries > 0 then
      got = got + take(k, out, entries, lvl, now, lease_ms, nonce, starts, false)
    end
    if #entries < asked then lvl = lvl + 1 end
  end
  return got
end

-- Claim replies are {header..., id, payload, token, deliveries, attempts, ...}; the memo
-- keeps the header, the call's nonce and the ids only: the i-th delivery's token is the
-- nonce and its position in the reply (header + 5 (i - 1)), and its counts are in its
-- record. Nothing is kept when nothing was claimed, unless `wrote` (lease.lua: the entry it
-- was given was handled, so a re-send would find it gone and count a lost claim).
local function remember_claim(k, out, header, nonce, now, wrote)
  if REQUEST_ID == '' or (#out <= header and not wrote) then return out end
  local kept = {}
  for i = 1, header do kept[i] = out[i] end
  kept[header + 1] = nonce
  for i = header + 1, #out, 5 do kept[#kept + 1] = out[i] end
  remember(k.memo, k.memo_exp, kept, now)
  return out
end

-- The reply of a re-sent claim: the first run's, leaving out the claims no longer held under
-- their tokens. A claim whose start the consumer reported since (`starts` off) answers with
-- the attempts it had when it was claimed.
local function replay_claim(k, kept, header, starts)
  local out = {}
  for i = 1, header do out[i] = tonumber(kept[i]) end
  local nonce = kept[header + 1]
  for j = header + 2, #kept do
    local id = kept[j]
    local token = nonce .. (header + 5 * (j - header - 2))
    local m = meta_get(k.meta, id)
    local payload = m and m.t == token and redis.call('HGET', k.payloads, id)
    if payload then
      out[#out + 1] = id
      out[#out + 1] = payload
      out[#out + 1] = token
      out[#out + 1] = m.n
      out[#out + 1] = (starts or not m.s) and m.a or m.a - 1
    end
  end
  return out
end
