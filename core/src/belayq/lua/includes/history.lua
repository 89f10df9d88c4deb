-- history.lua: what a queue tells about finished messages, when asked to (both off by
-- default, and then they cost one flag test): a capped, expiring history of the last
-- HISTORY_MAX messages acked (`history_done`) and dead-lettered (`history_failed`), and
-- events published on the queue's channel.
--
-- A history record is a JSON header, a newline, then the first bytes of the payload (which
-- need not be text): {"id", "result" or "reason", "deliveries", "attempts",
-- "published_ms", "finished_ms"}. The channel is derived from the stats key, whose prefix
-- (and so hash tag and cluster slot) every key of the queue shares: <prefix>events. An
-- event is JSON: {"event", "id", "deliveries", "attempts", "ms", and "reason" for failed,
-- reclaimed and dead_lettered}.
-- @include context

local HISTORY_PAYLOAD_MAX = 1024

local function emit(k, event, id, m, reason, now)
  if not EVENTS then return end
  local body = {event = event, id = id, deliveries = m.n, attempts = m.a, ms = now}
  if reason and reason ~= '' then body.reason = reason end
  redis.call(EVENTS, events_channel(k.stats), cjson.encode(body))
end

-- @when history
local function note_history(key, id, m, field, text, payload, now)
  if HISTORY_MAX == 0 or not key then return end
  local head = {id = id, deliveries = m.n, attempts = m.a, published_ms = m.u, finished_ms = now}
  head[field] = text
  redis.call('LPUSH', key, cjson.encode(head) .. '\n' ..
    string.sub(payload or '', 1, HISTORY_PAYLOAD_MAX))
  redis.call('LTRIM', key, 0, HISTORY_MAX - 1)
  redis.call('PEXPIRE', key, HISTORY_TTL_MS)
end

-- A pause or a resume (`action`) in the queue's control history, when the history is on:
-- a JSON record {"action", "by", "at_ms"}, newest first, capped and expiring as the others.
-- @when history
local function note_control(key, action, by, now)
  if HISTORY_MAX == 0 then return end
  redis.call('LPUSH', key, cjson.encode({action = action, by = by, at_ms = now}))
  redis.call('LTRIM', key, 0, HISTORY_MAX - 1)
  redis.call('PEXPIRE', key, HISTORY_TTL_MS)
end
