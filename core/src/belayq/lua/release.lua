-- release.lua: hand unstarted claims straight back to the front of their ready lists
-- (clean shutdown). The delivery does not count: the deliveries counter goes back down.
--
-- KEYS: the common vector (lib/common.lua).
-- ARGV[6..] pairs of (id, token)
-- Returns the number released; stale pairs are refused and counted in stats.stale_acks.
-- @include common

local earlier = earlier_reply()
if earlier then return tonumber(earlier[1]) end

local now = now_ms()
local released, stale = 0, 0
for i = #ARGV - 1, 6, -2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local m = mkey(id)
  if token ~= '0' and redis.call('HGET', m, 't') == token then
    local entry = entry_of(id)
    redis.call('LREM', processing, -1, entry)
    redis.call('HINCRBY', m, 'n', -1)
    send_back(id, entry, now, 0, nil, true, false)
    released = released + 1
  else
    stale = stale + 1
  end
end
fix_door()
count('released', released)
count('stale_acks', stale)
remember({released})
return released
