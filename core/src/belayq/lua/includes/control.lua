-- control.lua: what pause.lua and resume.lua share: their keys and arguments, and the
-- record of a pause or a resume (the control history, an event).
-- @include check
-- @include context
-- @include counters
-- @include history
-- @include memo

-- The longest `by` a pause or resume records (bytes).
local BY_MAX = 200

local function control_keys()
  return {leases = KEYS[1], stats = KEYS[2], unpaused = KEYS[3], history_control = KEYS[4],
    memo = KEYS[5], memo_exp = KEYS[6]}
end

-- ARGV[7] by: who acts, as the caller describes itself; checked.
local function control_by()
  args_exactly(7)
  local by = any_arg(7, 'by')
  if #by > BY_MAX or string.find(by, '%c') then
    bad('by (ARGV[7]) must be at most ' .. BY_MAX .. ' bytes with no control character, got "' ..
      shown(by) .. '"')
  end
  return by
end

-- Record `action` ('paused' or 'resumed'): in the control history and as an event, when
-- those are on. The event has the fields of a message's (history.lua), with no id and who
-- acted as its reason.
local function note_action(k, action, by, now)
  note_control(k.history_control, action, by, now)
  if EVENTS then
    redis.call(EVENTS, events_channel(k.stats), cjson.encode(
      {event = action, id = '', deliveries = 0, attempts = 0, ms = now, reason = by}))
  end
end
