-- publish.lua: store messages and make them ready (or delayed), in order.
--
-- KEYS[1] meta       hash id -> state (written for delayed messages only), trace contexts
-- KEYS[2] payloads   hash id -> payload (id mode; inline: delayed messages only)
-- KEYS[3] leases     zset id -> deadline (read: the state of a deduplicated message)
-- KEYS[4] delayed    zset id -> due time
-- KEYS[5] dead       zset id -> dead at (read)
-- KEYS[6] memo       hash: this call's reply (a re-send stores nothing), dedup ids
-- KEYS[7] memo_exp   zset memo field -> expiry
-- KEYS[8] stats      hash of counters
-- KEYS[9..] levels   ready lists, highest priority first
-- ARGV[1..6]         see includes/context.lua; ARGV[5] is the first message's id
-- ARGV[7]  dedup_window_ms
-- ARGV[8..] one group of five per message:
--   id        chosen by the client (inline mode: derived from the payload; a delayed copy of
--             a payload whose id is in use goes by '<id> #<n>', includes/copies.lua); in id
--             mode an id whose message is in the queue (its payload is) stores nothing and
--             answers as a deduplicated publish
--   payload   bytes
--   level     1-based priority level
--   delay_ms  0 = ready now; > 0 = due after that many ms (server clock)
--   dedup_id  '' = none; else a publish with the same dedup id within the window stores
--             nothing and answers with the first message's id
-- ARGV[last] optional, present when the values after ARGV[7] number 5n + 1: the publisher's
--            trace context (belayq.otel: its W3C headers as a JSON object '{...}'), kept
--            with each message stored, in the meta field '<id> trace', until the message
--            goes (ack, purge, drop, a deleted dead letter). An object that cannot be kept
--            (over 8192 bytes, a byte outside printable ASCII, or '{}': the publisher's was
--            too long to send) is not: the messages are stored untraced, counted in
--            stats.untraced (tracing never fails a publish)
-- Returns {id1, stored1, state1, ...}: stored is 1, or 0 when a dedup id suppressed it;
-- state is '' when stored, else where the first message is now: 'ready', 'delayed',
-- 'in_flight', 'dead', 'gone' (settled or purged), or 'unknown' (inline mode: ready or gone).
-- FLAGS: none: a full server (maxmemory) refuses it whole, before anything is stored
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include copies
-- @include counters
-- @include ids
-- @include meta
-- @include memo
-- @include ready

local k = {meta = KEYS[1], payloads = KEYS[2], leases = KEYS[3], delayed = KEYS[4],
  dead = KEYS[5], memo = KEYS[6], memo_exp = KEYS[7], stats = KEYS[8], levels = {}}
for i = 9, #KEYS do k.levels[#k.levels + 1] = KEYS[i] end
local dedup_window_ms = int_arg(7, 'dedup_window_ms', 1)
local last, context = #ARGV, nil
if (#ARGV - 7) % 5 == 1 then
  last, context = #ARGV - 1, ARGV[#ARGV]
  if not string.find(context, '^{.*}$') then
    bad('context (ARGV[' .. #ARGV .. ']) must be a JSON object, got "' .. shown(context) .. '"')
  end
  if #context > 8192 or context == '{}' or string.find(context, '[^ -~]') then
    context = false
  end
end
arg_groups(8, 5, 'messages', 1, last)
for g = 8, last, 5 do
  text_arg(g, 'id')
  any_arg(g + 1, 'payload')
  int_arg(g + 2, 'level', 1, #k.levels)
  int_arg(g + 3, 'delay_ms', 0)
  any_arg(g + 4, 'dedup_id')
end
local now = now_ms()

local earlier = earlier_reply(k.memo, k.memo_exp, now)
if earlier then
  for i = 2, #earlier, 3 do earlier[i] = tonumber(earlier[i]) end  -- stored: an integer
  return earlier
end

local function state_of(id)
  if redis.call('ZSCORE', k.leases, id) then return 'in_flight' end
  if redis.call('ZSCORE', k.delayed, id) then return 'delayed' end
  if redis.call('ZSCORE', k.dead, id) then return 'dead' end
  if INLINE then return 'unknown' end
  if redis.call('HEXISTS', k.payloads, id) == 1 then return 'ready' end
  return 'gone'
end

local out, contexts = {}, {}
local published, deduplicated = 0, 0
for g = 8, last, 5 do
  local id, payload = ARGV[g], ARGV[g + 1]
  local lvl, delay_ms, dedup_id = tonumber(ARGV[g + 2]), tonumber(ARGV[g + 3]), ARGV[g + 4]
  if INLINE then id = id_of(payload) end  -- a delayed copy is named below
  local first = dedup_id ~= '' and memo_get(k.memo, k.memo_exp, 'd:' .. dedup_id, now)
  if not first and not INLINE and redis.call('HEXISTS', k.payloads, id) == 1 then first = id end
  if first then
    out[#out + 1] = first
    out[#out + 1] = 0
    out[#out + 1] = state_of(first)
    deduplicated = deduplicated + 1
  else
    if INLINE and delay_ms > 0 then id = copy_free(k, id) end
    if dedup_id ~= '' then
      memo_put(k.memo, k.memo_exp, 'd:' .. dedup_id, id, dedup_window_ms, now)
    end
    if not INLINE or delay_ms > 0 then redis.call('HSET', k.payloads, id, payload) end
    if delay_ms > 0 then
      meta_put(k.meta, id, meta_new(lvl, now))
      redis.call('ZADD', k.delayed, now + delay_ms, id)
    else
      push_tail(k.levels[lvl], INLINE and payload or id)
    end
    if context then
      contexts[#contexts + 1] = context_field(id)
      contexts[#contexts + 1] = context
    end
    published = published + 1
    out[#out + 1] = id
    out[#out + 1] = 1
    out[#out + 1] = ''
  end
end
if #contexts > 0 then
  sliced(function(...) return redis.call('HSET', k.meta, ...) end, contexts)
end
fix_door(k.levels)
count(k.stats, 'published', published)
if context == false then count(k.stats, 'untraced', published) end
count(k.stats, 'deduplicated', deduplicated)
return remember(k.memo, k.memo_exp, out, now)
