-- nack.lua: settle a failed claim: back to ready now, into delayed, or to the dead-letter
-- list (after max_deliveries, or at once when asked).
--
-- KEYS: the common vector (lib/common.lua).
-- ARGV[5] id, ARGV[6] token
-- ARGV[7] delay_ms      0 = ready now (front of its list), > 0 = delayed that long
-- ARGV[8] reason        stored as the last error
-- ARGV[9] bury          '1' = dead-letter now whatever the delivery count
-- Returns 'ready' | 'delayed' | 'dead' | 'stale'.
-- @include common

local id, token = ARGV[5], ARGV[6]
local delay_ms = tonumber(ARGV[7])
local reason = ARGV[8]
local now = now_ms()
local m = mkey(id)
if token == '0' or redis.call('HGET', m, 't') ~= token then
  count('stale_acks', 1)
  return 'stale'
end
local entry = entry_of(id)
redis.call('LREM', processing, -1, entry)
count('nacked', 1)
if ARGV[9] == '1' then
  redis.call('ZREM', leases, id)
  dead_letter(id, reason, now)
  return 'dead'
end
local outcome = send_back(id, entry, now, delay_ms, reason, true, true)
fix_door()
return outcome
