-- claim.lua: claim up to N ready messages in one step (no gap): LMOVE + lease per message.
--
-- Before claiming it sweeps at most `sweep_limit` expired leases of this queue and promotes
-- at most `sweep_limit` due delayed messages, so recovery never depends on a sweeper alone.
--
-- KEYS: the common vector (lib/common.lua).
-- ARGV[6] lease_ms      lease length of each claim (ms)
-- ARGV[7] count         how many messages to claim at most
-- ARGV[8] floor_every   every k-th claim serves the lowest non-empty level (0 = off)
-- ARGV[9] sweep_limit   bound of the pre-claim sweep and promotion
-- Returns {next_due_ms, id1, payload1, token1, deliveries1, id2, ...}; next_due_ms is the
-- wait until the next delayed message is due, or -1 when none is delayed.
-- @include common

local earlier = earlier_reply()
if earlier then return replay_claim(earlier, 1) end

local lease_ms = tonumber(ARGV[6])
local want = tonumber(ARGV[7])
local floor_every = tonumber(ARGV[8])
local sweep_limit = tonumber(ARGV[9])
local now = now_ms()

sweep_expired(now, sweep_limit)
promote_due(now, sweep_limit)
local out = {0}
claim_ready(want, now, lease_ms, floor_every, out)
fix_door()
out[1] = next_due_in(now)
return remember_claim(out, 1)
