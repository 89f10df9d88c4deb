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
-- FLAGS: allow-oom (a full server still runs it: the claims go back)
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include counters
-- @include holds
-- @include ready
-- @include settle

local k = {leases = KEYS[1], meta = KEYS[2], payloads = KEYS[3], stats = KEYS[4], levels = {}}
for i = 5, #KEYS do k.levels[#k.levels + 1] = KEYS[i] end
arg_groups(7, 2, 'claims', 1)
for i = 7, #ARGV, 2 do
  text_arg(i, 'id')
  text_arg(i + 1, 'token')
end

-- Every claim's state is read before anything is written, last first as they are handed
-- back. A message named again after its release counts as stale if it keeps a state.
local back, kept = {}, {}
local stale = 0
for i = #ARGV - 1, 7, -2 do
  local id = ARGV[i]
  local m = kept[id] == nil and holds(k.meta, id, ARGV[i + 1])
  if m then
    m.n = math.max(0, m.n - 1)
    if m.s then m.a = math.max(0, m.a - 1) end
    back[#back + 1] = {id = id, m = m}
    kept[id] = not (m.n == 0 and m.a == 0 and m.x == 0 and m.e == '') and
      (not INLINE or redis.call('HEXISTS', k.payloads, id) == 1)
  elseif kept[id] or (kept[id] == nil and redis.call('HEXISTS', k.meta, id) == 1) then
    stale = stale + 1
  end
end

-- Last first, so that pushing each to the head keeps the claims' order.
for _, b in ipairs(back) do
  redis.call('ZREM', k.leases, b.id)
  to_ready(k, b.id, b.m, true)
end
local released = #back
fix_door(k.levels)
count(k.stats, 'released', released)
count(k.stats, 'stale_acks', stale)
return released
