-- defer.lua: hand unstarted claims back to wait in the delayed set until they are due (a
-- consumer that finds a message's time has not come: a Celery ETA). Like release, the
-- delivery does not count: the counters go back down.
--
-- KEYS[1] leases     zset id -> lease deadline
-- KEYS[2] delayed    zset id -> due time
-- KEYS[3] meta       hash id -> state
-- KEYS[4] payloads   hash id -> payload (inline mode: the payload waits here)
-- KEYS[5] stats      hash of counters
-- ARGV[1..6]         see includes/context.lua
-- ARGV[7..]          triples of (id, token, delay_ms): due after delay_ms (server clock)
-- Returns the number deferred; triples held by another claim are refused and counted in
-- stats.stale_acks.
-- @include context
-- @include counters
-- @include holds
-- @include meta

local leases, delayed, meta, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[5]
local now = now_ms()
local deferred, stale = 0, 0
for i = 7, #ARGV - 2, 3 do
  local id, token, delay_ms = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local m = holds(meta, id, token)
  if m then
    redis.call('ZREM', leases, id)
    m.n = math.max(0, m.n - 1)
    if m.s then m.a = math.max(0, m.a - 1) end
    m.t, m.s = '', false
    meta_put(meta, id, m)
    redis.call('ZADD', delayed, now + math.max(0, delay_ms), id)
    deferred = deferred + 1
  elseif redis.call('HEXISTS', meta, id) == 1 then
    stale = stale + 1
  end
end
count(stats, 'deferred', deferred)
count(stats, 'stale_acks', stale)
return deferred
