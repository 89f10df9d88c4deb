-- defer.lua: hand unstarted claims back to wait in the delayed set until they are due (a
-- consumer that finds a message's time has not come: a Celery ETA). Like release, the
-- delivery does not count: the counters go back down.
--
-- KEYS[1] leases     zset id -> lease deadline
-- KEYS[2] delayed    zset id -> due time
-- KEYS[3] meta       hash id -> state
-- KEYS[4] payloads   hash id -> payload (inline mode: the payload waits here)
-- KEYS[5] stats      hash of counters
-- KEYS[6] memo       hash: this call's reply, for a re-sent call
-- KEYS[7] memo_exp   zset memo field -> expiry
-- ARGV[1..6]         see includes/context.lua
-- ARGV[7..]          triples of (id, token, delay_ms): due after delay_ms (server clock)
-- Returns the number deferred; triples held by another claim are refused and counted in
-- stats.stale_acks. A call re-sent with the same request id answers as its first run did.
-- FLAGS: allow-oom (a full server still runs it: the claims go back)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include counters
-- @include holds
-- @include memo
-- @include meta

local leases, delayed, meta, stats, memo, memo_exp =
  KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[6], KEYS[7]
arg_groups(7, 3, 'deferrals', 1)
for i = 7, #ARGV, 3 do
  text_arg(i, 'id')
  text_arg(i + 1, 'token')
  int_arg(i + 2, 'delay_ms', 0)
end

local now = now_ms()
local earlier = earlier_reply(memo, memo_exp, now)
if earlier then return tonumber(earlier[1]) end

-- Every claim's state is read before anything is written. A message named again after its
-- deferral counts as stale (it keeps its state, waiting).
local wait, seen = {}, {}
local stale = 0
for i = 7, #ARGV, 3 do
  local id = ARGV[i]
  local m = not seen[id] and holds(meta, id, ARGV[i + 1])
  if m then
    seen[id] = true
    wait[#wait + 1] = {id = id, m = m, delay_ms = tonumber(ARGV[i + 2])}
  elseif seen[id] or redis.call('HEXISTS', meta, id) == 1 then
    stale = stale + 1
  end
end

for _, w in ipairs(wait) do
  local m = w.m
  redis.call('ZREM', leases, w.id)
  m.n = math.max(0, m.n - 1)
  if m.s then m.a = math.max(0, m.a - 1) end
  m.t, m.s = '', false
  meta_put(meta, w.id, m)
  redis.call('ZADD', delayed, now + w.delay_ms, w.id)
end
local deferred = #wait
count(stats, 'deferred', deferred)
count(stats, 'stale_acks', stale)
if deferred + stale > 0 then remember(memo, memo_exp, {deferred}, now) end
return deferred
