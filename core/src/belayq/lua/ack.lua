-- ack.lua: settle claims for good: the lease and the message's state (its trace context
-- too) go.
--
-- KEYS[1] leases    zset id -> lease deadline
-- KEYS[2] meta      hash id -> state, trace contexts
-- KEYS[3] payloads  hash id -> payload
-- KEYS[4] stats     hash of counters
-- KEYS[5] history_done  list: the last acked messages (history on)
-- KEYS[6] memo      hash: the reply of a call that refused a claim, for a re-sent call
-- KEYS[7] memo_exp  zset memo field -> expiry
-- ARGV[1..6]        see includes/context.lua
-- ARGV[7] results   '1': triples (id, token, result) follow, the result kept in the history
--                   (history on); '0': pairs (id, token)
-- ARGV[8..]         one pair or triple per claim to ack
-- Returns one integer per pair: 1 acked (or already gone: a re-sent ack whose first run
-- settled it), 0 refused: another claim holds the message, or it is waiting or dead again
-- (counted in stats.stale_acks; nothing changes). An inline message that waits again with
-- nothing to remember (released) cannot be told from a gone one: 1. A call re-sent with
-- the same request id answers as its first run did: one that found every claim held keeps
-- no memo (a re-send finds them gone: 1 each, nothing written), one that refused a claim
-- keeps its reply, so a re-send counts nothing again.
-- Acked messages go into the done history and out as completed events when those are on.
-- FLAGS: allow-oom (a full server still runs it: it frees memory)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include copies
-- @include counters
-- @include history
-- @include memo
-- @include meta

local k = {leases = KEYS[1], meta = KEYS[2], payloads = KEYS[3], stats = KEYS[4],
  history_done = KEYS[5], memo = KEYS[6], memo_exp = KEYS[7]}
local leases, meta, payloads, stats = k.leases, k.meta, k.payloads, k.stats
local step = flag_arg(7, 'results') and 3 or 2
arg_groups(8, step, 'claims', 1)
for i = 8, #ARGV, step do
  text_arg(i, 'id')
  text_arg(i + 1, 'token')
end

-- Every claim's state is read before anything is written (one HMGET). A message named
-- twice is acked once; the second answers as a re-sent ack does.
local now = (EVENTS or HISTORY_MAX > 0) and now_ms() or 0
local ids = {}
for i = 8, #ARGV, step do ids[#ids + 1] = ARGV[i] end
local packed = sliced(function(...) return redis.call('HMGET', meta, ...) end, ids)
local out, settled, done, told = {}, {}, {}, {}
local stale, gone = 0, 0
for j, id in ipairs(ids) do
  local i = 8 + (j - 1) * step
  local token = ARGV[i + 1]
  local record = packed[j]
  if done[id] then
    out[j] = 1
  elseif record and token ~= '0' and meta_token_is(record, token) then
    done[id] = true
    settled[#settled + 1] = id
    if EVENTS or HISTORY_MAX > 0 then
      told[#told + 1] = {id = id, m = meta_parse(record), result = step == 3 and ARGV[i + 2] or '',
        payload = HISTORY_MAX > 0 and redis.call('HGET', payloads, id)}
    end
    out[j] = 1
  elseif record or redis.call('HEXISTS', payloads, id) == 1 then
    stale = stale + 1
    out[j] = 0
  else
    gone = gone + 1
    out[j] = 1
  end
end

-- Only a call that finds a claim not held under its token may be a re-send.
if stale + gone > 0 then
  if now == 0 then now = now_ms() end
  local earlier = earlier_reply(k.memo, k.memo_exp, now)
  if earlier then
    for j = 1, #earlier do earlier[j] = tonumber(earlier[j]) end
    return earlier
  end
end

for _, t in ipairs(told) do
  note_history(k.history_done, t.id, t.m, 'result', t.result, t.payload, now)
  emit(k, 'completed', t.id, t.m, nil, now)
end
if #settled > 0 then
  sliced(function(...) return redis.call('ZREM', leases, ...) end, settled)
  local fields = {}
  for _, id in ipairs(settled) do
    fields[#fields + 1] = id
    fields[#fields + 1] = context_field(id)
  end
  sliced(function(...) return redis.call('HDEL', meta, ...) end, fields)
  sliced(function(...) return redis.call('HDEL', payloads, ...) end, settled)
  if INLINE then
    for _, id in ipairs(settled) do
      if string.find(id, ' #', 1, true) then copy_gone(k, id) end
    end
  end
end
count(stats, 'acked', #settled)
count(stats, 'stale_acks', stale)
if stale > 0 then remember(k.memo, k.memo_exp, out, now) end
return out
