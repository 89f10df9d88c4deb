-- resume.lua: resume the claims of a queue pause.lua paused. The bell is rung into the
-- unpaused list, where the consumers told that the queue is paused block (each BLMOVEs the
-- list onto itself, so the one bell wakes every one of them in turn); each then claims as
-- usual. A consumer that finds the queue paused after the resume finds the bell at once.
--
-- KEYS: as pause.lua.
-- ARGV[1..6]  see includes/context.lua
-- ARGV[7] by  who resumes it, as the caller describes itself (up to 200 bytes; may be '')
-- Returns 1 when the queue was paused and is resumed now, 0 when it was not paused
-- (nothing is written then). A call re-sent with the same request id answers as its first
-- run did.
-- FLAGS: allow-oom (a full server still runs it, so its queue can drain again)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include control
-- @include memo
-- @include ready

local k = control_keys()
local by = control_by()
local now = now_ms()
local earlier = earlier_reply(k.memo, k.memo_exp, now)
if earlier then return tonumber(earlier[1]) end
if redis.call('HEXISTS', k.stats, 'paused') == 0 then return 0 end

redis.call('HDEL', k.stats, 'paused')
redis.call('DEL', k.unpaused)
redis.call('RPUSH', k.unpaused, BELL)
note_action(k, 'resumed', by, now)
remember(k.memo, k.memo_exp, {1}, now)
return 1
