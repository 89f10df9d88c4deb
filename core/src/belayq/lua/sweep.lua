-- sweep.lua: the explicit, idempotent recovery pass.
--
-- 1. expired leases go back to the front of their ready lists (or to dead after
--    max_deliveries);
-- 2. processing entries with no lease (a claimer died between BLMOVE and lease.lua) get a
--    provisional lease (token '0'); if their claimer does not take it over before it
--    expires, step 1 of a later sweep puts them back;
-- 3. due delayed messages are promoted;
-- 4. the bell is rung if only lower levels hold work.
-- With guard_ms > 0 it runs at most once per guard_ms fleet-wide (SET NX PX on KEYS[6]).
--
-- KEYS: the common vector (lib/common.lua).
-- ARGV[6] limit         bound on expired leases and delayed promotions handled per run
-- ARGV[7] guard_ms      0 = always run; else the fleet-wide period
-- ARGV[8] grace_ms      length of a provisional lease (ms)
-- Returns {ran, reclaimed, dead_lettered, adopted, promoted, orphans_found}.
-- @include common

local limit = tonumber(ARGV[6])
local guard_ms = tonumber(ARGV[7])
local grace_ms = tonumber(ARGV[8])
if guard_ms > 0 and not redis.call('SET', guard, '1', 'NX', 'PX', guard_ms) then
  return {0, 0, 0, 0, 0, 0}
end
local now = now_ms()
local reclaimed, died, adopted = sweep_expired(now, limit)

local orphans = 0
local entries = redis.call('LRANGE', processing, 0, -1)
for _, entry in ipairs(entries) do
  if entry == BELL then
    redis.call('LREM', processing, 0, BELL)
  else
    local id = id_of(entry)
    if not redis.call('ZSCORE', leases, id) then
      local m = mkey(id)
      if inline and redis.call('EXISTS', m) == 0 then redis.call('HSET', m, 'l', 1) end
      if inline then redis.call('HSET', m, 'p', entry) end
      redis.call('HSET', m, 't', '0')
      redis.call('ZADD', leases, now + grace_ms, id)
      orphans = orphans + 1
    end
  end
end
count('orphans_found', orphans)

local promoted = promote_due(now, limit)
fix_door()
count('sweeps', 1)
return {1, reclaimed, died, adopted, promoted, orphans}
