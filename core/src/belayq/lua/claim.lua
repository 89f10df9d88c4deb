-- claim.lua: claim up to N ready messages in one step, with no landing: pop + lease.
--
-- First it returns at most `sweep_limit` expired leases, gives entries left in the landing
-- zone a provisional lease and promotes due delayed messages, so recovery never depends on a
-- sweeper alone (also with no lease keeper running).
--
-- KEYS[1] processing  BLMOVE's landing zone
-- KEYS[2] leases      zset id -> lease deadline (ms)
-- KEYS[3] delayed     zset id -> due time (ms)
-- KEYS[4] dead        zset id -> dead at (ms)
-- KEYS[5] meta        hash id -> state
-- KEYS[6] payloads    hash id -> payload
-- KEYS[7] memo        hash: the reply, for a re-sent call
-- KEYS[8] memo_exp    zset memo field -> expiry
-- KEYS[9] stats       hash of counters
-- KEYS[10] history_failed  list: the last dead-lettered messages (history on)
-- KEYS[11..] levels   ready lists, highest priority first
-- ARGV[1..6]          see includes/context.lua
-- ARGV[7]  lease_ms     lease length of each claim (ms)
-- ARGV[8]  count        how many messages to claim at most
-- ARGV[9]  floor_every  every k-th claim serves the lowest non-empty level (0 = off)
-- ARGV[10] sweep_limit  bound of the recovery steps
-- ARGV[11] nonce        random bits of the client: the claims' tokens start with it, then
--                       '@' and the claim's time (ms): a lease tells how long it has run
-- ARGV[12] starts       '1': each claim counts as a started attempt now
-- Returns {next_due_ms, id1, payload1, token1, deliveries1, attempts1, id2, ...};
-- next_due_ms is the wait until the next delayed message is due, or -1 when none is; -2
-- when the queue is paused (pause.lua): then nothing is claimed, while the recovery steps
-- still run (expired leases go back to ready, where they wait for the resume).
-- FLAGS: allow-oom (a full server still runs it, so a full queue can still drain:
-- each claim leads to an ack that frees its message)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include claim_keys
-- @include claiming
-- @include recover

local k = claim_keys()
local a = claim_args(12)
local now = now_ms()
a.nonce = claim_nonce(a.nonce, now)

local earlier = earlier_reply(k.memo, k.memo_exp, now)
if earlier then return replay_claim(k, earlier, 1, a.starts) end

local paused = is_paused(k)
local out = {recover_bounded(k, now, a.sweep_limit, a.lease_ms)}
if paused then
  out[1] = PAUSED
else
  claim_ready(k, a.want, now, a.lease_ms, a.floor_every, a.nonce, a.starts, out)
end
fix_door(k.levels)
return remember_claim(k, out, 1, a.nonce, now)
