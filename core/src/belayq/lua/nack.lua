-- nack.lua: settle a failed claim: back to ready now, into delayed, or to the dead-letter
-- list (after max_deliveries, or at once when asked).
--
-- KEYS: the common vector (lib/common.lua).
-- ARGV[6] id, ARGV[7] token
-- ARGV[8] delay_ms      0 = ready now (front of its list), > 0 = delayed that long
-- ARGV[9] reason        stored as the last error
-- ARGV[10] bury          '1' = dead-letter now whatever the delivery count
-- Returns 'ready' | 'delayed' | 'dead' | 'stale'.
-- @include common

local earlier = earlier_reply()
if earlier then return earlier[1] end

local function finish(outcome)
  remember({outcome})
  return outcome
end

local id, token = ARGV[6], ARGV[7]
local delay_ms = tonumber(ARGV[8])
local reason = ARGV[9]
local now = now_ms()
local m = mkey(id)
if token == '0' or redis.call('HGET', m, 't') ~= token then
  count('stale_acks', 1)
  return finish('stale')
end
local entry = entry_of(id)
redis.call('LREM', processing, -1, entry)
count('nacked', 1)
if ARGV[10] == '1' then
  redis.call('ZREM', leases, id)
  dead_letter(id, reason, now)
  return finish('dead')
end
local outcome = send_back(id, entry, now, delay_ms, reason, true, true)
fix_door()
return finish(outcome)
