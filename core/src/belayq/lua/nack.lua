-- nack.lua: settle a failed claim: back to ready now, into delayed, or to the dead-letter set
-- (after max_deliveries runs, or at once when asked). The run counts as an attempt.
--
-- KEYS[1] leases     zset id -> lease deadline
-- KEYS[2] delayed    zset id -> due time
-- KEYS[3] dead       zset id -> dead at
-- KEYS[4] meta       hash id -> state
-- KEYS[5] payloads   hash id -> payload
-- KEYS[6] stats      hash of counters
-- KEYS[7] history_failed  list: the last dead-lettered messages (history on)
-- KEYS[8] memo       hash: this call's reply, for a re-sent call
-- KEYS[9] memo_exp   zset memo field -> expiry
-- KEYS[10..] levels  ready lists, highest priority first
-- ARGV[1..6]         see includes/context.lua
-- ARGV[7] id, ARGV[8] token
-- ARGV[9]  delay_ms  0 = ready now (front of its list), > 0 = delayed that long
-- ARGV[10] reason    kept as the last error
-- ARGV[11] bury      '1' = dead-letter now whatever the count
-- ARGV[12] runs_before  (optional, with ARGV[13]; bury only) runs the framework made of this
--          message under earlier ids (a Dramatiq retry is a new message): added to its
--          deliveries and attempts in the dead letter
-- ARGV[13] payload   (optional; bury only) '' = keep it; else the payload the dead letter
--          keeps, which a replay delivers (refused in inline mode, where the entry is it)
-- Returns 'ready' | 'delayed' | 'dead' | 'stale' (refused: not held by this token). A call
-- re-sent with the same request id answers as its first run did.
-- FLAGS: allow-oom (a full server still runs it: the claim must settle)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include counters
-- @include holds
-- @include memo
-- @include ready
-- @include settle

local k = {leases = KEYS[1], delayed = KEYS[2], dead = KEYS[3], meta = KEYS[4],
  payloads = KEYS[5], stats = KEYS[6], history_failed = KEYS[7], memo = KEYS[8],
  memo_exp = KEYS[9], levels = {}}
for i = 10, #KEYS do k.levels[#k.levels + 1] = KEYS[i] end
if #ARGV ~= 11 and #ARGV ~= 13 then bad('expected 11 or 13 arguments, got ' .. #ARGV) end
local id, token = text_arg(7, 'id'), text_arg(8, 'token')
local delay_ms = int_arg(9, 'delay_ms', 0)
local reason = any_arg(10, 'reason')
local bury = flag_arg(11, 'bury')
local runs_before, payload = 0, ''
if #ARGV == 13 then
  runs_before = int_arg(12, 'runs_before', 0)
  payload = any_arg(13, 'payload')
  if payload ~= '' and INLINE then bad('payload (ARGV[13]) cannot replace an inline entry') end
end

local now = now_ms()
local earlier = earlier_reply(k.memo, k.memo_exp, now)
if earlier then return earlier[1] end
local m = holds(k.meta, id, token)
if not m then
  if redis.call('HEXISTS', k.meta, id) == 1 then
    count(k.stats, 'stale_acks', 1)
    remember(k.memo, k.memo_exp, {'stale'}, now)  -- a re-send counts it once
  end
  return 'stale'
end
count(k.stats, 'nacked', 1)
local outcome = 'dead'
if bury then
  redis.call('ZREM', k.leases, id)
  if not m.s then m.a = m.a + 1 end
  m.n, m.a = m.n + runs_before, m.a + runs_before
  if payload ~= '' then redis.call('HSET', k.payloads, id, payload) end
  dead_letter(k, id, m, reason, now)
else
  outcome = send_back(k, id, m, now, delay_ms, reason, true, true)
  fix_door(k.levels)
  if outcome ~= 'dead' then emit(k, 'failed', id, m, reason, now) end
end
remember(k.memo, k.memo_exp, {outcome}, now)
return outcome
