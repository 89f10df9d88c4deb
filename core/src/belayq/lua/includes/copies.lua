-- copies.lua: identical entries of an inline queue (payload_in_list): the list entry is the
-- payload and the id derives from it, yet every copy pushed is its own message. A copy's
-- record (meta, lease, delayed or dead entry, stored payload) goes by the plain id while that
-- is free, else by '<id> #<n>' for a free n >= 2 (no plain id holds a space). While copies
-- n >= 2 may exist, the meta field '<id> #' holds the highest n given, so that every copy is
-- found; a payload that never had two copies at once costs one read, as an id does.
--
-- A copy's record is in one of four states: free (no record), waiting (its entry is in a
-- ready list: the record keeps its counts), landing (a provisional lease: its entry is in
-- the landing zone) or taken (held, delayed or dead). Identical entries cannot be told
-- apart, so a waiting record goes with whichever identical entry is taken first.
-- @include context
-- @include meta

local function copy_id(plain, n)
  if n == 1 then return plain end
  return plain .. ' #' .. n
end

local function copy_state(k, id, m)
  if not m then return 'free' end
  if m.t == '0' then return 'landing' end
  if m.t ~= '' or m.d > 0 or redis.call('ZSCORE', k.delayed, id) then return 'taken' end
  return 'waiting'
end

-- Every copy of `plain`: {id, m, state} for n = 1 .. the highest given.
local function copies_of(k, plain)
  local top = tonumber(redis.call('HGET', k.meta, plain .. ' #') or '1')
  local out = {}
  for n = 1, top do
    local id = copy_id(plain, n)
    local m = meta_get(k.meta, id)
    out[n] = {id = id, m = m, state = copy_state(k, id, m)}
  end
  return out
end

-- A new copy id after `copies` (copies_of's list), recorded as the highest given.
local function copy_next(k, plain, copies)
  local n = #copies + 1
  copies[n] = {id = copy_id(plain, n), state = 'free'}
  redis.call('HSET', k.meta, plain .. ' #', n)
  return copies[n].id
end

-- The copy an entry taken off a ready list (or, `landing`, out of the landing zone) stands
-- for: the first waiting copy (landing: or one with a provisional lease), else the first
-- free one, else a new one. Returns its id and record (nil: a fresh message).
local function copy_taken(k, plain, landing)
  local copies = copies_of(k, plain)
  local free, others = nil, false
  for n, c in ipairs(copies) do
    if c.state == 'waiting' or (landing and c.state == 'landing') then return c.id, c.m end
    if c.state == 'free' and not free then free = c.id end
    others = others or (n > 1 and c.state ~= 'free')
  end
  if free == plain and #copies > 1 and not others then
    redis.call('HDEL', k.meta, plain .. ' #')  -- the other copies are gone
  end
  return free or copy_next(k, plain, copies), nil
end

-- A free copy id of `plain` for a new record (a delayed publish).
local function copy_free(k, plain)
  local copies = copies_of(k, plain)
  for _, c in ipairs(copies) do
    if c.state == 'free' then return c.id end
  end
  return copy_next(k, plain, copies)
end

-- After the record of copy `id` went: forget the highest copy given once no copy n >= 2 has
-- a record left.
local function copy_gone(k, id)
  local plain = string.match(id, '^(.*) #%d+$') or id
  local top = tonumber(redis.call('HGET', k.meta, plain .. ' #') or '1')
  for n = 2, top do
    if redis.call('HEXISTS', k.meta, copy_id(plain, n)) == 1 then return end
  end
  redis.call('HDEL', k.meta, plain .. ' #')
end

-- Delete the record of message `id` (inline: a copy's, see copy_gone).
local function forget_record(k, id)
  redis.call('HDEL', k.meta, id)
  if INLINE and string.find(id, ' #', 1, true) then copy_gone(k, id) end
end
