-- meta.lua: a message's state, one field of the queue's meta hash, packed as
--   '<level> <deliveries> <attempts> <landings lost> <started> <published ms> <dead ms>
--    <token>|<last error>'
-- level is 1-based; deliveries counts claims, attempts counts started runs (a claim counts
-- as started at once unless the consumer prefetches and reports starts itself); landings
-- lost counts BLMOVE-d entries whose claimer vanished before the lease; started says the
-- current claim was started; token is '' (not held), '0' (a provisional lease of the sweep,
-- which no settle accepts) or the current claim's fencing token.
-- A fresh message waiting in a ready list needs no meta: it is created on its first claim.
-- @include context

local META = '^(%d+) (%d+) (%d+) (%d+) ([01]) (%d+) (%d+) ([^|]*)|(.*)$'

local function meta_new(level, now)
  return {l = level, n = 0, a = 0, x = 0, s = false, u = now, d = 0, t = '', e = ''}
end

-- The record a meta field holds (nil: not one).
local function meta_parse(packed)
  local l, n, a, x, s, u, d, t, e = string.match(packed, META)
  if not l then return nil end
  return {l = tonumber(l), n = tonumber(n), a = tonumber(a), x = tonumber(x), s = s == '1',
    u = tonumber(u), d = tonumber(d), t = t, e = e}
end

local function meta_text(m)
  return string.format('%d %d %d %d %s %d %d %s|%s', m.l, m.n, m.a, m.x, m.s and '1' or '0',
    m.u, m.d, m.t, m.e)
end

-- Whether the packed record's token is `token`, read without parsing the rest: the token
-- ends at the record's first '|' and follows a space.
local function meta_token_is(packed, token)
  local bar = string.find(packed, '|', 1, true)
  return bar ~= nil and string.sub(packed, bar - #token - 1, bar - 1) == ' ' .. token
end

-- Lua unpacks a bounded number of values at once: long argument lists go in slices.
local SLICE = 500

-- call(values...) for `values` in slices: the replies, concatenated (array replies) or
-- summed (integer replies).
local function sliced(call, values)
  local all, sum = {}, 0
  for i = 1, #values, SLICE do
    local r = call(unpack(values, i, math.min(i + SLICE - 1, #values)))
    if type(r) == 'table' then
      for _, v in ipairs(r) do all[#all + 1] = v end
    else
      sum = sum + r
    end
  end
  return all, sum
end

local function meta_get(meta, id)
  local packed = redis.call('HGET', meta, id)
  if not packed then return nil end
  return meta_parse(packed)
end

local function meta_put(meta, id, m)
  redis.call('HSET', meta, id, meta_text(m))
end

-- The meta field that holds the trace context of message `id`'s publisher (publish.lua),
-- written with the message and deleted with it: '<id> trace', the copies of an inline
-- entry ('<id> #<n>') sharing their plain id's. No message id holds a space, so it is no
-- message's record.
local function context_field(id)
  return (string.match(id, '^(.*) #%d+$') or id) .. ' trace'
end
