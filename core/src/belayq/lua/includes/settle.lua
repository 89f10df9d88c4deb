-- settle.lua: where a message goes when no claim holds it any more.
-- `k` is the script's table of keys (leases, delayed, dead, meta, payloads, stats, levels).
-- @include context
-- @include copies
-- @include counters
-- @include history
-- @include meta
-- @include ready

-- Put message `id` (not held) on its ready list: at the head (claimed next) when `front`.
-- In inline mode the entry is the payload, which leaves the payloads hash; a meta that
-- remembers nothing (as a fresh message's) is dropped. Returns false when the payload is gone.
local function to_ready(k, id, m, front)
  local entry = id
  if INLINE then
    entry = redis.call('HGET', k.payloads, id)
    if not entry then
      forget_record(k, id)
      redis.call('HDEL', k.meta, context_field(id))
      count(k.stats, 'malformed', 1)
      return false
    end
    redis.call('HDEL', k.payloads, id)
  end
  local list = k.levels[level_in(k.levels, m.l)]
  if front then push_head(list, entry) else push_tail(list, entry) end
  m.t, m.s = '', false
  if m.n == 0 and m.a == 0 and m.x == 0 and m.e == '' then
    forget_record(k, id)
  else
    meta_put(k.meta, id, m)
  end
  return true
end

-- Move message `id` (not held) to the dead-letter set with `reason`; the oldest dead
-- letters beyond dead_max are dropped with their payloads and trace contexts. It goes into the failed history
-- and out as a dead_lettered event when those are on.
local function dead_letter(k, id, m, reason, now)
  m.t, m.s, m.e, m.d = '', false, reason, now
  meta_put(k.meta, id, m)
  redis.call('ZADD', k.dead, now, id)
  count(k.stats, 'dead_lettered', 1)
  if HISTORY_MAX > 0 then
    note_history(k.history_failed, id, m, 'reason', reason, redis.call('HGET', k.payloads, id), now)
  end
  emit(k, 'dead_lettered', id, m, reason, now)
  local over = redis.call('ZCARD', k.dead) - DEAD_MAX
  if over > 0 then
    local old = redis.call('ZPOPMIN', k.dead, over)
    for i = 1, #old, 2 do
      forget_record(k, old[i])
      redis.call('HDEL', k.meta, context_field(old[i]))
      redis.call('HDEL', k.payloads, old[i])
    end
    count(k.stats, 'dead_dropped', over)
  end
end

-- Settle a held message that failed (nack: `ran`, the run counts as an attempt if the
-- consumer had not reported it started) or whose lease expired (a run only if it started).
-- After max_deliveries attempts it is dead-lettered; else it waits `delay_ms` or goes back
-- to its ready list (`front`: claimed next). Returns 'dead', 'delayed' or 'ready'.
local function send_back(k, id, m, now, delay_ms, reason, front, ran)
  redis.call('ZREM', k.leases, id)
  if ran and not m.s then m.a = m.a + 1 end
  local started = m.s or ran
  if reason ~= '' then m.e = reason end
  if started and m.a >= MAX_DELIVERIES then
    dead_letter(k, id, m, (reason ~= '' and reason or 'failed') .. ' (ran ' .. m.a ..
      ' times, delivered ' .. m.n .. ' times, max_deliveries=' .. MAX_DELIVERIES .. ')', now)
    return 'dead'
  end
  if delay_ms > 0 then
    m.t, m.s = '', false
    meta_put(k.meta, id, m)
    redis.call('ZADD', k.delayed, now + delay_ms, id)
    return 'delayed'
  end
  to_ready(k, id, m, front)
  return 'ready'
end
