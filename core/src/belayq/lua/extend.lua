-- extend.lua: push the lease deadline of many claims to now + lease_ms, token-checked, and
-- record which of them the consumer has started (the batched start signal: no round trip
-- of its own).
--
-- KEYS[1] leases  zset id -> lease deadline
-- KEYS[2] meta    hash id -> state
-- KEYS[3] stats   hash of counters
-- ARGV[1..6]      see includes/context.lua
-- ARGV[7] lease_ms
-- ARGV[8] count_stale  '1': refusals count in stats.stale_acks; '0' for the keeper's own
--                      heartbeat, which may race a settle of the same claim
-- ARGV[9..] triples (id, token, start): start '1' = the consumer started this claim's work
--           (counted once per claim as an attempt)
-- Returns one integer per triple: 1 extended, 0 refused (the claim was swept or settled;
-- the caller must stop working on it).
-- @include context
-- @include counters
-- @include holds

local leases, meta, stats = KEYS[1], KEYS[2], KEYS[3]
local deadline = now_ms() + tonumber(ARGV[7])
local out = {}
local stale = 0
for i = 9, #ARGV, 3 do
  local id, token = ARGV[i], ARGV[i + 1]
  local m = holds(meta, id, token)
  if m then
    redis.call('ZADD', leases, 'XX', deadline, id)
    if ARGV[i + 2] == '1' and not m.s then
      m.a, m.s = m.a + 1, true
      meta_put(meta, id, m)
    end
    out[#out + 1] = 1
  else
    stale = stale + 1
    out[#out + 1] = 0
  end
end
if ARGV[8] == '1' then count(stats, 'stale_acks', stale) end
return out
