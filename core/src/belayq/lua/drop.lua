-- drop.lua: delete a queue that holds no claimed message: its waiting messages, its dead
-- letters and every key of its own (counters too). A queue with claims in flight or landing
-- is left as it is.
--
-- KEYS[1] processing, KEYS[2] leases, KEYS[3] delayed, KEYS[4] dead, KEYS[5] meta,
-- KEYS[6] payloads, KEYS[7] memo, KEYS[8] memo_exp, KEYS[9] stats,
-- KEYS[10] history_done, KEYS[11] history_failed, KEYS[12] observed,
-- KEYS[13] history_control, KEYS[14] unpaused, KEYS[15] consumers, KEYS[16] lead,
-- KEYS[17..] levels
-- ARGV[1..6]  see includes/context.lua
-- Returns 1 when dropped, 0 when claims are in flight.
-- FLAGS: allow-oom (a full server still runs it: it frees memory)
-- MEMO: none (a re-send finds nothing left to delete and answers 1 again; a memo would
-- outlive the keys it deletes)
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context

args_exactly(6)
if redis.call('LLEN', KEYS[1]) > 0 or redis.call('ZCARD', KEYS[2]) > 0 then
  return 0
end
redis.call('DEL', unpack(KEYS))
return 1
