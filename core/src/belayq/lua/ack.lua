-- ack.lua: settle claims for good: the lease and the message's state go.
--
-- KEYS[1] leases    zset id -> lease deadline
-- KEYS[2] meta      hash id -> state
-- KEYS[3] payloads  hash id -> payload
-- KEYS[4] stats     hash of counters
-- KEYS[5] history_done  list: the last acked messages (history on)
-- ARGV[1..6]        see includes/context.lua
-- ARGV[7] results   '1': triples (id, token, result) follow, the result kept in the history
--                   (history on); '0': pairs (id, token)
-- ARGV[8..]         one pair or triple per claim to ack
-- Returns one integer per pair: 1 acked (or already gone: a re-sent ack whose first run
-- settled it), 0 refused: another claim holds the message, or it is waiting or dead again
-- (counted in stats.stale_acks; nothing changes). An inline message that waits again with
-- nothing to remember (released) cannot be told from a gone one: 1.
-- Acked messages go into the done history and out as completed events when those are on.
-- @include context
-- @include counters
-- @include history
-- @include holds

local k = {leases = KEYS[1], meta = KEYS[2], payloads = KEYS[3], stats = KEYS[4],
  history_done = KEYS[5]}
local leases, meta, payloads, stats = k.leases, k.meta, k.payloads, k.stats
local step = ARGV[7] == '1' and 3 or 2
local now = (EVENTS or HISTORY_MAX > 0) and now_ms() or 0
local out = {}
local acked, stale = 0, 0
for i = 8, #ARGV, step do
  local id, token = ARGV[i], ARGV[i + 1]
  local m = holds(meta, id, token)
  if m then
    if HISTORY_MAX > 0 then
      local result = step == 3 and ARGV[i + 2] or ''
      note_history(k.history_done, id, m, 'result', result, redis.call('HGET', payloads, id), now)
    end
    emit(k, 'completed', id, m, nil, now)
    redis.call('ZREM', leases, id)
    redis.call('HDEL', meta, id)
    redis.call('HDEL', payloads, id)
    acked = acked + 1
    out[#out + 1] = 1
  elseif redis.call('HEXISTS', meta, id) == 1 or redis.call('HEXISTS', payloads, id) == 1 then
    stale = stale + 1
    out[#out + 1] = 0
  else
    out[#out + 1] = 1
  end
end
count(stats, 'acked', acked)
count(stats, 'stale_acks', stale)
return out
