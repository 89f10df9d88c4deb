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
-- FLAGS: allow-oom (a full server still runs it: it frees memory)
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include copies
-- @include counters
-- @include history
-- @include holds

local k = {leases = KEYS[1], meta = KEYS[2], payloads = KEYS[3], stats = KEYS[4],
  history_done = KEYS[5]}
local leases, meta, payloads, stats = k.leases, k.meta, k.payloads, k.stats
local step = flag_arg(7, 'results') and 3 or 2
arg_groups(8, step, 'claims', 1)
for i = 8, #ARGV, step do
  text_arg(i, 'id')
  text_arg(i + 1, 'token')
end

-- Every claim's state is read before anything is written. A message named twice is acked
-- once; the second answers as a re-sent ack does.
local now = (EVENTS or HISTORY_MAX > 0) and now_ms() or 0
local out, settle = {}, {}
local acked, stale = 0, 0
for i = 8, #ARGV, step do
  local id = ARGV[i]
  local m = not settle[id] and holds(meta, id, ARGV[i + 1])
  if m then
    settle[id] = {m = m, result = step == 3 and ARGV[i + 2] or '',
      payload = HISTORY_MAX > 0 and redis.call('HGET', payloads, id)}
    acked = acked + 1
    out[#out + 1] = 1
  elseif not settle[id] and (redis.call('HEXISTS', meta, id) == 1 or
      redis.call('HEXISTS', payloads, id) == 1) then
    stale = stale + 1
    out[#out + 1] = 0
  else
    out[#out + 1] = 1
  end
end

for i = 8, #ARGV, step do
  local id = ARGV[i]
  local s = settle[id]
  if s and not s.done then
    s.done = true
    note_history(k.history_done, id, s.m, 'result', s.result, s.payload, now)
    emit(k, 'completed', id, s.m, nil, now)
    redis.call('ZREM', leases, id)
    forget_record(k, id)
    redis.call('HDEL', payloads, id)
  end
end
count(stats, 'acked', acked)
count(stats, 'stale_acks', stale)
return out
