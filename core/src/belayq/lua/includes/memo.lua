-- memo.lua: short-lived records in the queue's memo hash (replies of re-sendable calls, dedup
-- ids), each with an expiry in the memo_exp zset. Writes drop expired records as they go
-- (and every sweep does), so the hash holds about what was written within one window;
-- nothing is written by a call that changed nothing.
-- @include context

local function memo_get(memo, memo_exp, field, now)
  local value = redis.call('HGET', memo, field)
  if not value then return nil end
  local expires = tonumber(redis.call('ZSCORE', memo_exp, field) or '0')
  if expires <= now then return nil end
  return value
end

-- Lua unpacks a bounded number of values at once: the records go in slices.
local MEMO_SLICE = 500

local function memo_trim(memo, memo_exp, now, limit)
  local old = redis.call('ZRANGEBYSCORE', memo_exp, '-inf', now, 'LIMIT', 0, limit)
  for i = 1, #old, MEMO_SLICE do
    local last = math.min(i + MEMO_SLICE - 1, #old)
    redis.call('HDEL', memo, unpack(old, i, last))
    redis.call('ZREM', memo_exp, unpack(old, i, last))
  end
  return #old
end

-- One write in four (by the field's last byte: request ids and dedup ids vary there) drops
-- up to 8 expired records: on average more than each write adds, at a quarter of the calls.
local function memo_put(memo, memo_exp, field, value, ttl_ms, now)
  if string.byte(field, -1) % 4 == 0 then memo_trim(memo, memo_exp, now, 8) end
  redis.call('HSET', memo, field, value)
  redis.call('ZADD', memo_exp, now + ttl_ms, field)
end

-- Replies are kept as length-prefixed strings: '<len>:<bytes>' per element.
local function pack(t)
  local parts = {}
  for i, v in ipairs(t) do
    v = tostring(v)
    parts[i] = #v .. ':' .. v
  end
  return table.concat(parts)
end

local function unpack_reply(s)
  local out, pos = {}, 1
  while pos <= #s do
    local colon = string.find(s, ':', pos, true)
    local n = tonumber(string.sub(s, pos, colon - 1))
    out[#out + 1] = string.sub(s, colon + 1, colon + n)
    pos = colon + n + 1
  end
  return out
end

-- The reply an earlier run of this request kept, or nil.
local function earlier_reply(memo, memo_exp, now)
  if REQUEST_ID == '' then return nil end
  local s = memo_get(memo, memo_exp, 'r:' .. REQUEST_ID, now)
  if not s then return nil end
  return unpack_reply(s)
end

local function remember(memo, memo_exp, reply, now)
  if REQUEST_ID ~= '' then
    memo_put(memo, memo_exp, 'r:' .. REQUEST_ID, pack(reply), REPLY_WINDOW_MS, now)
  end
  return reply
end
