-- publish.lua: store one message and make it ready (or delayed).
--
-- KEYS: the common vector (lib/common.lua); writes the ready list of the message's level,
--   `delayed`, `stats`, the message hash and the dedup key.
-- ARGV[6] id            message id chosen by the client (ignored in inline mode: sha1 of payload)
-- ARGV[7] payload       bytes
-- ARGV[8] level         1-based priority level
-- ARGV[9] delay_ms      0 = ready now; > 0 = due after that many ms (server clock)
-- ARGV[10] dedup_id      '' = no dedup; else a publish with the same dedup id within the
--                       window returns the first message's id and stores nothing
-- ARGV[11] dedup_window_ms
-- Returns {id, created} where created is 1, or 0 when the dedup id suppressed the publish.
-- @include common

-- A re-sent publish must not store the message twice. In id mode the message hash is the
-- proof (the id is fresh per call); inline mode keeps a short reply record instead.
local earlier = nil
if inline then
  earlier = earlier_reply()
elseif redis.call('EXISTS', mkey(ARGV[6])) == 1 then
  earlier = {ARGV[6], 1}
end
if earlier then return earlier end

local id = ARGV[6]
local payload = ARGV[7]
local lvl = tonumber(ARGV[8])
local delay_ms = tonumber(ARGV[9])
local dedup_id = ARGV[10]
local now = now_ms()

if inline then id = id_of(payload) end

if dedup_id ~= '' then
  local dkey = base .. 'dedup:' .. dedup_id
  local first = redis.call('GET', dkey)
  if first then
    count('deduplicated', 1)
    if inline then remember({first, 0}) end
    return {first, 0}
  end
  redis.call('SET', dkey, id, 'PX', tonumber(ARGV[11]))
end

local m = mkey(id)
if not inline then
  redis.call('HSET', m, 'p', payload, 'l', lvl, 'u', now)
elseif delay_ms > 0 then
  redis.call('HSET', m, 'p', payload, 'l', lvl)
end

if delay_ms > 0 then
  redis.call('ZADD', delayed, now + delay_ms, id)
else
  redis.call('LPUSH', levels[lvl], inline and payload or id)
  fix_door()
end
count('published', 1)
if inline then remember({id, 1}) end
return {id, 1}
