-- lease.lua: register the lease of an entry a blocking BLMOVE moved into processing, then
-- claim up to count-1 more ready messages in the same step.
--
-- BLMOVE cannot run inside Lua, so between it and this script the entry sits in processing
-- with no lease. The sweep (sweep.lua) gives such an entry a provisional lease (token '0');
-- this script takes it over if it arrives in time. If the provisional lease expired first,
-- the entry went back to ready and this script answers lost: the claimer must not run it.
--
-- KEYS: the common vector (lib/common.lua).
-- ARGV[6] lease_ms, ARGV[7] count, ARGV[8] floor_every: as in claim.lua
-- ARGV[9] entry         the element BLMOVE returned
-- Returns {next_due_ms, lost, id1, payload1, token1, deliveries1, ...}; lost is 1 when the
-- BLMOVE-d entry could not be leased (swept back, or a copy already in flight).
-- @include common

local earlier = earlier_reply()
if earlier then return replay_claim(earlier, 2) end

local lease_ms = tonumber(ARGV[6])
local want = tonumber(ARGV[7])
local floor_every = tonumber(ARGV[8])
local entry = ARGV[9]
local now = now_ms()

local out = {0, 0}
if entry == BELL then
  redis.call('LREM', processing, 1, BELL)
elseif not redis.call('LPOS', processing, entry) then
  count('lost_claims', 1)
  out[2] = 1
else
  local d = lease_entry(entry, 1, now, lease_ms)
  if d then
    for _, v in ipairs(d) do out[#out + 1] = v end
    want = want - 1
  else
    out[2] = 1
  end
end
if want > 0 then claim_ready(want, now, lease_ms, floor_every, out) end
fix_door()
out[1] = next_due_in(now)
return remember_claim(out, 2)
