-- check.lua: the checks a script makes before its first write. Redis keeps a script's writes
-- up to an error, so a call with a bad argument must fail while it has written nothing:
-- each script checks all its arguments first, and a failed check is the error reply
-- 'BELAYQ bad argument: <what>' (belayq maps it to ConfigError).
--
-- Integers are plain decimal digits (no exponent, no hex, no fraction) within INT_MAX, which
-- a Lua number holds exactly; ms values and counts stay far below it.

local INT_MAX = 1000000000000000

-- A value as an error message shows it: control characters and quotes replaced, cut to
-- `max` bytes (40 by default).
local function shown(v, max)
  return (string.gsub(string.sub(v, 1, max or 40), '[%c"]', '?'))
end

local function bad(what)
  error('BELAYQ bad argument: ' .. what, 0)
end

local function int_arg(i, name, lo, hi)
  local v = ARGV[i]
  if v == nil then bad(name .. ' (ARGV[' .. i .. ']) is missing') end
  if #v > 17 or not string.find(v, '^%-?%d+$') then
    bad(name .. ' (ARGV[' .. i .. ']) must be an integer, got "' .. shown(v) .. '"')
  end
  local n = tonumber(v)
  hi = hi or INT_MAX
  if n < lo or n > hi then
    bad(string.format('%s (ARGV[%d]) must be within %d..%d, got %s', name, i, lo, hi, v))
  end
  return n
end

-- '1' is true, '0' false; anything else is refused.
local function flag_arg(i, name)
  local v = ARGV[i]
  if v ~= '0' and v ~= '1' then
    bad(name .. ' (ARGV[' .. i .. ']) must be 0 or 1, got "' .. shown(v or 'nothing') .. '"')
  end
  return v == '1'
end

local function text_arg(i, name)
  local v = ARGV[i]
  if v == nil or v == '' then bad(name .. ' (ARGV[' .. i .. ']) must not be empty') end
  return v
end

local function any_arg(i, name)
  local v = ARGV[i]
  if v == nil then bad(name .. ' (ARGV[' .. i .. ']) is missing') end
  return v
end

-- Exactly n arguments in all.
local function args_exactly(n)
  if #ARGV ~= n then bad('expected ' .. n .. ' arguments, got ' .. #ARGV) end
end

-- ARGV[first..last] (`last`: #ARGV by default) is a whole number of groups of `size`, at
-- least `least` of them. Returns how many.
local function arg_groups(first, size, what, least, last)
  local n = (last or #ARGV) - first + 1
  if n < 0 or n % size ~= 0 or n / size < least then
    bad(what .. ': ARGV[' .. first .. '..] must hold groups of ' .. size .. ' (at least ' ..
      least .. '), got ' .. math.max(n, 0) .. ' values')
  end
  return n / size
end

-- The key vector has `fixed` keys, then one or more ready lists when `levels`.
local function check_keys(fixed, levels)
  if (levels and #KEYS <= fixed) or (not levels and #KEYS ~= fixed) then
    bad('expected ' .. fixed .. (levels and ' keys and the ready lists' or ' keys') ..
      ', got ' .. #KEYS .. ' keys')
  end
end

-- Redis checks each command a script calls against the caller's ACL when the script calls
-- it: a refusal after the first write would leave half a transition. So every command the
-- call may run in its mode (sources.py lists them from the script's text) is checked first
-- with redis.acl_check_cmd (Redis 7.0+, Valkey); a refusal is the error reply
-- 'BELAYQ not permitted: <command and the rule to add>'. Redis 6.2 has no such check: there
-- a refused command still fails the script where it is called.
local function not_permitted(script, command, why, rule)
  error('BELAYQ not permitted: this ACL user may not run ' .. command .. why .. ', which ' ..
    script .. ' needs: add ' .. rule .. " to the user's rules (docs/acl.md)", 0)
end

-- `always`: the commands of every call; `history`: those of a call with the history on
-- (nil when it is off); `events`: 'PUBLISH' or 'SPUBLISH' when events are on, else false,
-- and `channel` the queue's event channel. Each command is checked with the call's first
-- key in every key position (the server has already checked the call's keys).
local function check_acl(script, always, history, events, channel)
  if not redis.acl_check_cmd then return end
  local key = KEYS[1]
  for _, command in ipairs(always) do
    if not redis.acl_check_cmd(command, key, key, key) then
      not_permitted(script, command, '', '+' .. string.lower(command))
    end
  end
  for _, command in ipairs(history or {}) do
    if not redis.acl_check_cmd(command, key, key, key) then
      not_permitted(script, command, ' (the history, history_max)',
        '+' .. string.lower(command))
    end
  end
  if events and not redis.acl_check_cmd(events, channel, 'event') then
    not_permitted(script, events, ' on channel ' .. shown(channel, 400) .. ' (events=True)',
      '+' .. string.lower(events) .. ' and a channel rule that matches it, such as &' ..
      shown(channel, 400))
  end
end
