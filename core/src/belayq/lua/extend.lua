-- extend.lua: push the lease deadline of many claims to now + lease_ms, token-checked.
--
-- KEYS: the common vector (lib/common.lua).
-- ARGV[6] lease_ms
-- ARGV[7] count_stale   '1': refusals count in stats.stale_acks; '0' for the keeper's own
--                       heartbeat, which may race a settle of the same claim
-- ARGV[8..] pairs of (id, token)
-- Returns one integer per pair: 1 extended, 0 refused (stale token: the claim was swept or
-- settled; the caller must stop working on it).
-- @include common

local deadline = now_ms() + tonumber(ARGV[6])
local out = {}
local stale = 0
for i = 8, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if token ~= '0' and redis.call('HGET', mkey(id), 't') == token then
    redis.call('ZADD', leases, 'XX', deadline, id)
    out[#out + 1] = 1
  else
    stale = stale + 1
    out[#out + 1] = 0
  end
end
if ARGV[7] == '1' then count('stale_acks', stale) end
return out
