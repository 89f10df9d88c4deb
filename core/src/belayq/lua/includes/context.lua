-- context.lua: the arguments every belayq script takes first, and the server clock.
--
-- ARGV[1] skew_ms          added to the server clock; 0 except in tests that move time
-- ARGV[2] mode             first char '1': list entries are the payloads themselves (inline
--                          mode, id = the entry or its digest); '0': entries are ids. Flags
--                          after it: 'L' the head of the ready lists (claimed next) is their
--                          LEFT end, as RQ's (producers RPUSH), else their RIGHT end, as
--                          kombu's (producers LPUSH); 'N' never ring the bell; 'T' keep no
--                          counters (a transient queue: no stats hash); 'E' publish
--                          events ('S': with SPUBLISH, the sharded form); 'H<n>,<ms>' keep
--                          the last n finished messages of each kind for ms (history)
-- ARGV[3] max_deliveries   runs (started attempts) after which a failure is dead-lettered
-- ARGV[4] dead_max         cap of the dead-letter set
-- ARGV[5] request_id       '' or the id of a call whose re-send must answer as the first did
-- ARGV[6] reply_window_ms  how long that reply is kept
-- Script-specific arguments start at ARGV[7].

-- They are read and checked once per call by read_context(), which the loader runs before
-- the script's own statements (see sources.py): as a script (EVALSHA) or as a function of
-- belayq's library.
-- @include check

local SKEW_MS, INLINE, HEAD_LEFT, BELL_ON, MAX_DELIVERIES, DEAD_MAX, REQUEST_ID, REPLY_WINDOW_MS
local EVENTS, HISTORY_MAX, HISTORY_TTL_MS, TRANSIENT

local function read_context()
  SKEW_MS = int_arg(1, 'skew_ms', -INT_MAX)
  local mode = any_arg(2, 'mode')
  local n, ttl = string.match(mode, 'H(%d+),(%d+)')
  local flags = string.gsub(string.sub(mode, 2), 'H%d+,%d+', '', 1)
  if not string.find(mode, '^[01]') or not string.find(flags, '^L?N?T?E?S?$') or
      (n and (#n > 9 or #ttl > 15 or tonumber(n) < 1 or tonumber(ttl) < 1)) then
    bad('mode (ARGV[2]) is not a queue layout: "' .. shown(mode) .. '"')
  end
  INLINE = string.sub(mode, 1, 1) == '1'
  HEAD_LEFT = string.find(flags, 'L', 1, true) ~= nil
  BELL_ON = string.find(flags, 'N', 1, true) == nil
  TRANSIENT = string.find(flags, 'T', 1, true) ~= nil
  EVENTS = string.find(flags, 'E', 1, true) and
    (string.find(flags, 'S', 1, true) and 'SPUBLISH' or 'PUBLISH') or false
  HISTORY_MAX, HISTORY_TTL_MS = tonumber(n or 0), tonumber(ttl or 0)
  MAX_DELIVERIES = int_arg(3, 'max_deliveries', 1)
  DEAD_MAX = int_arg(4, 'dead_max', 1)
  REQUEST_ID = any_arg(5, 'request_id')
  REPLY_WINDOW_MS = int_arg(6, 'reply_window_ms', 1)
end

-- The queue's event channel: the prefix of its keys (so its hash tag and cluster slot) and
-- 'events', derived from its stats key.
local function events_channel(stats)
  return string.sub(stats, 1, -6) .. 'events'
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + SKEW_MS
end

local function int(n)
  return string.format('%d', n)
end
