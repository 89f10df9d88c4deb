-- lead.lua: make a consumer process the queue's lead for ttl_ms: the one process that
-- answers for the queue's delayed messages in its framework's views of them (Celery's
-- `inspect scheduled` lists them in that worker's reply only, so each is shown once, not
-- once per worker). The lead is taken when no process holds it and renewed by the process
-- that holds it; another process's lead is left alone until it expires, so a process that
-- stops or dies hands it over within ttl_ms. A queue with no delayed message has nothing to
-- lead: the call writes nothing (an idle consumer creates no key), and a lead taken before
-- lapses at its expiry.
--
-- KEYS[1] delayed  zset id -> due time (read only: whether it holds a message)
-- KEYS[2] lead     hash: 'member' holds the process that leads; the key expires after
--                  ttl_ms (a hash, so that the core's ACL rules cover it: docs/acl.md)
-- ARGV[1..6]  see includes/context.lua
-- ARGV[7] member  the caller, as it describes itself ('<tag> <host> <pid>'): 1 to 300
--                 bytes, no control character
-- ARGV[8] ttl_ms  how long the lead holds without being renewed (>= 1)
-- Returns 1 when the caller leads the queue now, 0 when another process does or no message
-- is delayed (nothing is written then).
-- FLAGS: none: a full server (maxmemory) refuses it whole (the lead then lapses)
-- MEMO: none (a re-send by the process that took the lead renews it: the same holder, its
-- expiry counted from then; one that found another's lead wrote nothing)
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context

local lead = KEYS[2]
args_exactly(8)
local member = any_arg(7, 'member')
if #member == 0 or #member > 300 or string.find(member, '%c') then
  bad('member (ARGV[7]) must be 1 to 300 bytes with no control character, got "' ..
    shown(member) .. '"')
end
local ttl_ms = int_arg(8, 'ttl_ms', 1)
if redis.call('ZCARD', KEYS[1]) == 0 then return 0 end
local holder = redis.call('HGET', lead, 'member')
if holder and holder ~= member then return 0 end

redis.call('HSET', lead, 'member', member)
redis.call('PEXPIRE', lead, ttl_ms)
return 1
