-- lease.lua: register the lease of an entry a blocking BLMOVE moved into the landing zone,
-- then claim up to count-1 more ready messages in the same step.
--
-- BLMOVE cannot run inside Lua, so between it and this script the entry sits in the landing
-- zone with no lease. A sweep gives such an entry a provisional lease (token '0'); this
-- script takes it over if it arrives in time. If the provisional lease expired first, the
-- entry went back to ready and this script answers lost: the claimer must not run it.
--
-- KEYS: as claim.lua.
-- ARGV[1..6]          see includes/context.lua
-- ARGV[7..12]         as claim.lua
-- ARGV[13] entry      the element BLMOVE returned
-- A paused queue (pause.lua) leases nothing: the entry goes back to the head of the first
-- ready list uncounted (no delivery, no claim), and next_due_ms is -2, which tells the
-- claimer to wait on the queue's unpaused list instead of its ready list (a BLMOVE the
-- pause found blocked takes the next message published, and hands it back here).
--
-- Returns {next_due_ms, lost, id1, payload1, token1, deliveries1, attempts1, ...}; lost is
-- 1 when the BLMOVE-d entry could not be leased (swept back, or its id already in flight).
-- FLAGS: allow-oom (a full server still runs it, so a full queue can still drain)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include claim_keys
-- @include claiming
-- @include recover

local k = claim_keys()
local a = claim_args(13)
local want = a.want
local entry = any_arg(13, 'entry')
local now = now_ms()
a.nonce = claim_nonce(a.nonce, now)

local earlier = earlier_reply(k.memo, k.memo_exp, now)
if earlier then return replay_claim(k, earlier, 2, a.starts) end

-- The entry is taken first (it may be the oldest landing entry), then the bounded
-- recovery runs as in claim.lua. The bell (rung into the first ready list, or the unpaused
-- list's) only wakes: it leases nothing.
local paused = is_paused(k)
local out = {0, 0}
if entry == BELL then
  redis.call('LREM', k.processing, 1, BELL)
elseif redis.call('LREM', k.processing, 1, entry) == 0 then
  count(k.stats, 'lost_claims', 1)
  out[2] = 1
elseif paused then
  hand_back(k, entry, now, a.lease_ms, a.nonce)
else
  if take(k, out, {entry}, 1, now, a.lease_ms, a.nonce, a.starts, true) == 1 then
    want = want - 1
  else
    out[2] = 1
  end
end
out[1] = recover_bounded(k, now, a.sweep_limit, a.lease_ms)
if paused then
  out[1] = PAUSED
elseif want > 0 then claim_ready(k, want, now, a.lease_ms, a.floor_every, a.nonce, a.starts, out) end
fix_door(k.levels)
return remember_claim(k, out, 2, a.nonce, now, entry ~= BELL)
