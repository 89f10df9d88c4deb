-- ack.lua: settle claims for good: remove from processing and leases, delete the message.
--
-- KEYS: the common vector (lib/common.lua).
-- ARGV[6..] pairs of (id, token), one per claim to ack.
-- Returns one integer per pair: 1 acked, 0 refused (stale or unknown token; counted in
-- stats.stale_acks and changes nothing).
-- @include common

local earlier = earlier_reply()
if earlier then return earlier end

local out = {}
local acked, stale = 0, 0
for i = 6, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local m = mkey(id)
  if token ~= '0' and redis.call('HGET', m, 't') == token then
    redis.call('LREM', processing, -1, entry_of(id))
    redis.call('ZREM', leases, id)
    redis.call('DEL', m)
    acked = acked + 1
    out[#out + 1] = 1
  else
    stale = stale + 1
    out[#out + 1] = 0
  end
end
count('acked', acked)
count('stale_acks', stale)
return remember(out)
