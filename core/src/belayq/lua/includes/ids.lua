-- ids.lua: the id of a list entry.
-- Short printable-ASCII entries (RQ job ids) are their own id; in inline mode long ones
-- (kombu envelopes) and any holding other bytes go by digest, so every id survives the trip
-- through a client as text. fakeredis has no redis.sha1hex: it gets a weaker digest.
-- @include context

local function digest(s)
  if redis.sha1hex then return redis.sha1hex(s) end
  local a, b = 7, 11
  for i = 1, #s do
    local c = string.byte(s, i)
    a = (a * 257 + c) % 2147483647
    b = (b * 263 + c) % 2147483629
  end
  return string.format('x%08x%08x%x', a, b, #s)
end

local function id_of(entry)
  if INLINE and (#entry > 64 or #entry == 0 or string.find(entry, '[^!-~]')) then
    return digest(entry)
  end
  return entry
end
