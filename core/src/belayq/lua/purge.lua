-- purge.lua: delete up to `limit` waiting messages (ready, then delayed when asked) with
-- their state and trace contexts.
-- Claimed messages and dead letters are not touched, nor the state of a held message whose
-- identical entry also waits in a ready list.
--
-- KEYS[1] delayed    zset id -> due time
-- KEYS[2] leases     zset id -> lease deadline (read)
-- KEYS[3] dead       zset id -> dead at (read)
-- KEYS[4] meta       hash id -> state, trace contexts
-- KEYS[5] payloads   hash id -> payload
-- KEYS[6] stats      hash of counters
-- KEYS[7] memo       hash: this call's reply, for a re-sent call
-- KEYS[8] memo_exp   zset memo field -> expiry
-- KEYS[9..] levels   ready lists, highest priority first
-- ARGV[1..6]         see includes/context.lua
-- ARGV[7] limit      most messages deleted by this call
-- ARGV[8] delayed    '1': delayed messages too; '0': ready ones only
-- ARGV[9] entries    '1': the reply also holds the purged ready list entries (a framework
--                    that keeps a record per entry deletes those, as RQ's job hashes)
-- Returns {ready purged, delayed purged, more, entry1, entry2, ...}: more is 1 when
-- messages of the kinds asked for are left (call again); the entries only when asked. A
-- call re-sent with the same request id answers as its first run did (its entries too) and
-- deletes nothing more, even when the first run deleted nothing (its reply is always kept).
-- FLAGS: allow-oom (a full server still runs it: it frees memory)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include copies
-- @include counters
-- @include ids
-- @include memo
-- @include ready

local delayed, leases, dead, meta, payloads, stats, memo, memo_exp =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local FIRST_LEVEL = 9
args_exactly(9)
local limit = int_arg(7, 'limit', 1)
local with_delayed = flag_arg(8, 'delayed')
local with_entries = flag_arg(9, 'entries')
local now = now_ms()
local earlier = earlier_reply(memo, memo_exp, now)
if earlier then
  for j = 1, 3 do earlier[j] = tonumber(earlier[j]) end
  return earlier
end
local entries = {}
local purged = 0

local function forget(id)
  if redis.call('ZSCORE', leases, id) or redis.call('ZSCORE', dead, id) then return end
  forget_record({meta = meta}, id)
  redis.call('HDEL', meta, context_field(id))
  redis.call('HDEL', payloads, id)
end

-- A purged ready entry's record: inline, the waiting copy it stands for (none: fresh).
local function forget_entry(entry)
  if not INLINE then return forget(entry) end
  redis.call('HDEL', meta, context_field(id_of(entry)))
  for _, c in ipairs(copies_of({meta = meta, delayed = delayed}, id_of(entry))) do
    if c.state == 'waiting' then
      return forget_record({meta = meta}, c.id)
    end
  end
end

for i = FIRST_LEVEL, #KEYS do
  local list = KEYS[i]
  while purged < limit do
    local batch = redis.call('LRANGE', list, 0, limit - purged - 1)
    if #batch == 0 then break end
    redis.call('LTRIM', list, #batch, -1)
    for _, entry in ipairs(batch) do
      if entry ~= BELL then
        purged = purged + 1
        forget_entry(entry)
        if with_entries then entries[#entries + 1] = entry end
      end
    end
  end
end
local ready_purged = purged
if with_delayed and purged < limit then
  for _, id in ipairs(redis.call('ZRANGE', delayed, 0, limit - purged - 1)) do
    redis.call('ZREM', delayed, id)
    forget(id)
    purged = purged + 1
  end
end
count(stats, 'purged', purged)
local more = with_delayed and redis.call('ZCARD', delayed) or 0
for i = FIRST_LEVEL, #KEYS do more = more + redis.call('LLEN', KEYS[i]) end
local out = {ready_purged, purged - ready_purged, more > 0 and 1 or 0}
for _, entry in ipairs(entries) do out[#out + 1] = entry end
remember(memo, memo_exp, out, now)
return out
