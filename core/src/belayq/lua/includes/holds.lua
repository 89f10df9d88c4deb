-- holds.lua: the one fencing check of ack, nack, extend and release.
-- @include meta

-- The state of message `id` when the claim with `token` holds it, else nil. The sweep's
-- provisional token '0' and the empty token are never accepted.
local function holds(meta, id, token)
  if token == '' or token == '0' then return nil end
  local m = meta_get(meta, id)
  if m and m.t == token then return m end
  return nil
end
