-- resign.lua: give up the caller's lead of the queue (lead.lua) when it holds it, as a
-- consumer that stops does: another consumer then takes the lead at its next renewal
-- instead of once the lead has expired. Another process's lead is left alone.
--
-- KEYS[1] delayed  zset id -> due time (not touched but by the first command)
-- KEYS[2] lead     hash: 'member' holds the process that leads
-- KEYS[3] memo     hash: this call's reply, for a re-sent call
-- KEYS[4] memo_exp zset memo field -> expiry
-- ARGV[1..6]  see includes/context.lua
-- ARGV[7] member  the caller, as lead.lua was given it: 1 to 300 bytes, no control character
-- Returns 1 when the caller's lead was given up, 0 when it held none (nothing is written
-- then). A call re-sent with the same request id answers as its first run did.
-- FLAGS: allow-oom (a full server still runs it: it frees memory)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include memo

local lead, memo, memo_exp = KEYS[2], KEYS[3], KEYS[4]
args_exactly(7)
local member = any_arg(7, 'member')
if #member == 0 or #member > 300 or string.find(member, '%c') then
  bad('member (ARGV[7]) must be 1 to 300 bytes with no control character, got "' ..
    shown(member) .. '"')
end
local now = now_ms()
local earlier = earlier_reply(memo, memo_exp, now)
if earlier then return tonumber(earlier[1]) end
if redis.call('HGET', lead, 'member') ~= member then return 0 end

redis.call('DEL', lead)
remember(memo, memo_exp, {1}, now)
return 1
