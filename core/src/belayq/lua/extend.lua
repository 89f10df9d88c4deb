-- extend.lua: push the lease deadline of many claims to now + lease_ms, token-checked, and
-- record which of them the consumer has started (the batched start signal: no round trip
-- of its own).
--
-- KEYS[1] leases  zset id -> lease deadline
-- KEYS[2] meta    hash id -> state
-- KEYS[3] stats   hash of counters
-- KEYS[4] memo     hash: this call's reply, for a re-sent call
-- KEYS[5] memo_exp zset memo field -> expiry
-- ARGV[1..6]      see includes/context.lua
-- ARGV[7] lease_ms
-- ARGV[8] count_stale  '1': refusals count in stats.stale_acks; '0' for the keeper's own
--                      heartbeat, which may race a settle of the same claim
-- ARGV[9..] triples (id, token, start): start '1' = the consumer started this claim's work
--           (counted once per claim as an attempt)
-- Returns one integer per triple: 1 extended, 0 refused (the claim was swept or settled;
-- the caller must stop working on it). A call re-sent with the same request id answers as
-- its first run did and moves no deadline again (a call sent with no request id, as a start
-- report sent without waiting, keeps no memo: its re-send is the keeper's next beat).
-- FLAGS: allow-oom (a full server still runs it: leases must not lapse)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include counters
-- @include holds
-- @include memo

local leases, meta, stats, memo, memo_exp = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local lease_ms = int_arg(7, 'lease_ms', 1)
local count_stale = flag_arg(8, 'count_stale')
arg_groups(9, 3, 'claims', 1)
for i = 9, #ARGV, 3 do
  text_arg(i, 'id')
  text_arg(i + 1, 'token')
  flag_arg(i + 2, 'start')
end

local now = now_ms()
local earlier = earlier_reply(memo, memo_exp, now)
if earlier then
  for j = 1, #earlier do earlier[j] = tonumber(earlier[j]) end
  return earlier
end

-- Every claim's state is read before anything is written; a claim named twice counts its
-- start once.
local held, order = {}, {}
local out = {}
local stale = 0
for i = 9, #ARGV, 3 do
  local id = ARGV[i]
  local h = held[id]
  if not h then
    local m = holds(meta, id, ARGV[i + 1])
    if m then
      h = {id = id, m = m, start = false}
      held[id] = h
      order[#order + 1] = h
    end
  elseif h.m.t ~= ARGV[i + 1] then
    h = nil
  end
  if h then
    h.start = h.start or (ARGV[i + 2] == '1' and not h.m.s)
    out[#out + 1] = 1
  else
    stale = stale + 1
    out[#out + 1] = 0
  end
end

local deadline = now + lease_ms
for _, h in ipairs(order) do
  redis.call('ZADD', leases, 'XX', deadline, h.id)
  if h.start then
    h.m.a, h.m.s = h.m.a + 1, true
    meta_put(meta, h.id, h.m)
  end
end
if count_stale then count(stats, 'stale_acks', stale) end
if #order > 0 or (count_stale and stale > 0) then remember(memo, memo_exp, out, now) end
return out
