-- ack.lua: settle claims for good: the lease and the message's state go.
--
-- KEYS[1] leases    zset id -> lease deadline
-- KEYS[2] meta      hash id -> state
-- KEYS[3] payloads  hash id -> payload
-- KEYS[4] stats     hash of counters
-- ARGV[1..6]        see includes/context.lua
-- ARGV[7..]         pairs of (id, token), one per claim to ack
-- Returns one integer per pair: 1 acked (or already gone: a re-sent ack whose first run
-- settled it), 0 refused: another claim holds the message, or it is waiting or dead again
-- (counted in stats.stale_acks; nothing changes). An inline message that waits again with
-- nothing to remember (released) cannot be told from a gone one: 1.
-- @include context
-- @include counters
-- @include holds

local leases, meta, payloads, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local out = {}
local acked, stale = 0, 0
for i = 7, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if holds(meta, id, token) then
    redis.call('ZREM', leases, id)
    redis.call('HDEL', meta, id)
    redis.call('HDEL', payloads, id)
    acked = acked + 1
    out[#out + 1] = 1
  elseif redis.call('HEXISTS', meta, id) == 1 or redis.call('HEXISTS', payloads, id) == 1 then
    stale = stale + 1
    out[#out + 1] = 0
  else
    out[#out + 1] = 1
  end
end
count(stats, 'acked', acked)
count(stats, 'stale_acks', stale)
return out
