-- release.lua: hand unstarted claims straight back to the front of their ready lists (clean
-- shutdown, prefetch beyond need). The delivery does not count: the counters go back down.
--
-- KEYS[1] leases     zset id -> lease deadline
-- KEYS[2] meta       hash id -> state
-- KEYS[3] payloads   hash id -> payload
-- KEYS[4] stats      hash of counters
-- KEYS[5..] levels   ready lists, highest priority first
-- ARGV[1..6]         see includes/context.lua
-- ARGV[7..]          pairs of (id, token)
-- Returns the number released; pairs held by another claim are refused and counted in
-- stats.stale_acks.
-- @include context
-- @include counters
-- @include holds
-- @include ready
-- @include settle

local k = {leases = KEYS[1], meta = KEYS[2], payloads = KEYS[3], stats = KEYS[4], levels = {}}
for i = 5, #KEYS do k.levels[#k.levels + 1] = KEYS[i] end
local released, stale = 0, 0
-- Last first, so that pushing each to the head keeps the claims' order.
for i = #ARGV - 1, 7, -2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local m = holds(k.meta, id, token)
  if m then
    redis.call('ZREM', k.leases, id)
    m.n = math.max(0, m.n - 1)
    if m.s then m.a = math.max(0, m.a - 1) end
    to_ready(k, id, m, true)
    released = released + 1
  elseif redis.call('HEXISTS', k.meta, id) == 1 then
    stale = stale + 1
  end
end
fix_door(k.levels)
count(k.stats, 'released', released)
count(k.stats, 'stale_acks', stale)
return released
