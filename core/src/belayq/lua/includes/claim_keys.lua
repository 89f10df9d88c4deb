-- claim_keys.lua: the key table of claim.lua, lease.lua and sweep.lua, which take the same
-- KEYS (claim.lua's contract block names them).

local function claim_keys()
  local k = {processing = KEYS[1], leases = KEYS[2], delayed = KEYS[3], dead = KEYS[4],
    meta = KEYS[5], payloads = KEYS[6], memo = KEYS[7], memo_exp = KEYS[8], stats = KEYS[9],
    history_failed = KEYS[10], levels = {}}
  for i = 11, #KEYS do k.levels[#k.levels + 1] = KEYS[i] end
  return k
end
