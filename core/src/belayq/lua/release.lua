-- release.lua: hand unstarted claims straight back to the front of their ready lists (clean
-- shutdown, prefetch beyond need). The delivery does not count: the counters go back down.
--
-- KEYS[1] leases     zset id -> lease deadline
-- KEYS[2] meta       hash id -> state
-- KEYS[3] payloads   hash id -> payload
-- KEYS[4] stats      hash of counters
-- KEYS[5] memo       hash: this call's reply, for a re-sent call
-- KEYS[6] memo_exp   zset memo field -> expiry
-- KEYS[7..] levels   ready lists, highest priority first
-- ARGV[1..6]         see includes/context.lua
-- ARGV[7..]          pairs of (id, token)
-- Returns the number released; pairs held by another claim are refused and counted in
-- stats.stale_acks. A call re-sent with the same request id answers as its first run did.
-- FLAGS: allow-oom (a full server still runs it: the claims go back)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include counters
-- @include holds
-- @include memo
-- @include ready
-- @include settle

local k = {leases = KEYS[1], meta = KEYS[2], payloads = KEYS[3], stats = KEYS[4],
  memo = KEYS[5], memo_exp = KEYS[6], levels = {}}
for i = 7, #KEYS do k.levels[#k.levels + 1] = KEYS[i] end
arg_groups(7, 2, 'claims', 1)
for i = 7, #ARGV, 2 do
  text_arg(i, 'id')
  text_arg(i + 1, 'token')
end

local now = REQUEST_ID ~= '' and now_ms() or 0
local earlier = earlier_reply(k.memo, k.memo_exp, now)
if earlier then return tonumber(earlier[1]) end

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
if released + stale > 0 then remember(k.memo, k.memo_exp, {released}, now) end
return released
