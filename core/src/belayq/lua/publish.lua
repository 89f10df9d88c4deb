-- publish.lua: store messages and make them ready (or delayed), in order.
--
-- KEYS: the common vector (lib/common.lua); writes the ready lists of the messages' levels,
--   `delayed`, `stats`, the message hashes and the dedup keys.
-- ARGV[6..] one group of six per message:
--   id              chosen by the client (in inline mode the id comes from the payload)
--   payload         bytes
--   level           1-based priority level
--   delay_ms        0 = ready now; > 0 = due after that many ms (server clock)
--   dedup_id        '' = no dedup; else a publish with the same dedup id within the
--                   window returns the first message's id and stores nothing
--   dedup_window_ms
-- Returns {id1, created1, id2, created2, ...}; created is 1, or 0 when a dedup id
-- suppressed that message.
-- @include common

-- A re-sent publish must not store a message twice. In id mode the message hash is the
-- proof (ids are fresh per call); inline mode keeps a short reply record instead.
if inline then
  local earlier = earlier_reply()
  if earlier then return earlier end
end

local now = now_ms()
local out = {}
local published = 0
for g = 6, #ARGV, 6 do
  local id, payload = ARGV[g], ARGV[g + 1]
  local lvl, delay_ms = tonumber(ARGV[g + 2]), tonumber(ARGV[g + 3])
  local dedup_id = ARGV[g + 4]
  if inline then id = id_of(payload) end
  local created = 1
  if not inline and redis.call('EXISTS', mkey(id)) == 1 then
    created = 1  -- this very call ran before (a re-send): already stored
  elseif dedup_id ~= '' and redis.call('SET', base .. 'dedup:' .. dedup_id, id, 'NX',
      'PX', tonumber(ARGV[g + 5])) == false then
    id = redis.call('GET', base .. 'dedup:' .. dedup_id)
    created = 0
    count('deduplicated', 1)
  else
    local m = mkey(id)
    if not inline then
      redis.call('HSET', m, 'p', payload, 'l', lvl, 'u', now)
    elseif delay_ms > 0 then
      redis.call('HSET', m, 'p', payload, 'l', lvl)
    end
    if delay_ms > 0 then
      redis.call('ZADD', delayed, now + delay_ms, id)
    else
      push_tail(levels[lvl], inline and payload or id)
    end
    published = published + 1
  end
  out[#out + 1] = id
  out[#out + 1] = created
end
fix_door()
count('published', published)
if inline then remember(out) end
return out
