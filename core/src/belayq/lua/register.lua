-- register.lua: record which host and process a consumer is, once, not on every claim: the
-- tokens of its claims start with its tag and a dot, and the record maps the tag to the
-- host and pid, so the queue's leases tell who holds each message. A consumer registers
-- again now and then (its record goes to the top), and the oldest records beyond `keep`
-- are dropped, so the set stays bounded however many processes come and go.
--
-- KEYS[1] leases     zset id -> lease deadline (not touched but by the first command)
-- KEYS[2] consumers  zset '<tag> <host> <pid>' -> registered at (ms, server clock)
-- ARGV[1..6]  see includes/context.lua
-- ARGV[7] tag   the consumer's tag: 1 to 32 hex digits
-- ARGV[8] host  its host name: 1 to 255 bytes, no space or control character
-- ARGV[9] pid   its process id (>= 1)
-- ARGV[10] keep most records kept (>= 1)
-- Returns 1. A record registered within the reply window (reply_window_ms) is left as it
-- is: a call re-sent after its reply was lost writes nothing.
-- FLAGS: none: a full server (maxmemory) refuses it whole (claims go on without it)
-- MEMO: none (a re-send finds its record registered within the reply window: it writes
-- nothing)
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context

local consumers = KEYS[2]
args_exactly(10)
local tag = any_arg(7, 'tag')
if not string.find(tag, '^%x+$') or #tag > 32 then
  bad('tag (ARGV[7]) must be 1 to 32 hex digits, got "' .. shown(tag) .. '"')
end
local host = any_arg(8, 'host')
if #host == 0 or #host > 255 or string.find(host, '[%c ]') then
  bad('host (ARGV[8]) must be 1 to 255 bytes with no space or control character, got "' ..
    shown(host) .. '"')
end
local pid = int_arg(9, 'pid', 1)
local keep = int_arg(10, 'keep', 1)
local now = now_ms()
local member = tag .. ' ' .. host .. ' ' .. int(pid)
local at = redis.call('ZSCORE', consumers, member)
if at and now - tonumber(at) < REPLY_WINDOW_MS then return 1 end

redis.call('ZADD', consumers, now, member)
redis.call('ZREMRANGEBYRANK', consumers, 0, -keep - 1)
return 1
