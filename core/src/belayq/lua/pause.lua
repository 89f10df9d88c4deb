-- pause.lua: pause the claims of a queue. From now on no claim hands out a message
-- (claim.lua and lease.lua read the 'paused' field of the stats hash, which they touch
-- anyway), until resume.lua. Publishes, extends, settles and sweeps go on as before: held
-- claims stay held, and expired leases go back to ready, where they wait for the resume.
--
-- The unpaused list is deleted: a consumer told that the queue is paused blocks on it (a
-- BLMOVE of the list onto itself) and wakes when resume.lua rings the bell there.
--
-- KEYS[1] leases           zset id -> lease deadline (not touched but by the first command)
-- KEYS[2] stats            hash: 'paused' holds when the queue was paused (ms, server clock)
-- KEYS[3] unpaused         list: the bell from a resume until this pause
-- KEYS[4] history_control  list: the last pauses and resumes (history on)
-- KEYS[5] memo             hash: this call's reply, for a re-sent call
-- KEYS[6] memo_exp         zset memo field -> expiry
-- ARGV[1..6]  see includes/context.lua
-- ARGV[7] by  who pauses it, as the caller describes itself (up to 200 bytes; may be '')
-- Returns 1 when the queue is paused now, 0 when it was already (nothing is written then).
-- A call re-sent with the same request id answers as its first run did.
-- FLAGS: allow-oom (a full server still runs it: pausing consumers may be what it needs)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include control
-- @include memo

local k = control_keys()
local by = control_by()
local now = now_ms()
local earlier = earlier_reply(k.memo, k.memo_exp, now)
if earlier then return tonumber(earlier[1]) end
if redis.call('HEXISTS', k.stats, 'paused') == 1 then return 0 end

redis.call('HSET', k.stats, 'paused', now)
redis.call('HSETNX', k.stats, 'schema', SCHEMA)
redis.call('DEL', k.unpaused)
note_action(k, 'paused', by, now)
remember(k.memo, k.memo_exp, {1}, now)
return 1
