-- sweep.lua: the explicit, idempotent recovery pass. Its cost is O(expired + landing +
-- due), never O(messages in flight), so every consumer's keeper may run it every period.
--
-- 1. expired leases go back to the front of their ready lists (or to dead after
--    max_deliveries runs);
-- 2. entries in the landing zone with no lease (a claimer died between BLMOVE and its lease)
--    get a provisional lease (token '0'); if their claimer does not take it over before it
--    expires, step 1 of a later sweep puts them back;
-- 3. due delayed messages are promoted;
-- 4. expired memo records (replies, dedup ids) are dropped;
-- 5. the bell is rung if only lower levels hold work.
-- A sweep that finds nothing to do writes nothing (every keeper runs it every period, so
-- an idle consumer creates no key): a re-send of such a sweep does the recovery the next
-- sweep would do anyway. One re-sent with the same request id after a sweep that did
-- something answers as its first run did (what it did), and does nothing more.
--
-- KEYS: as claim.lua.
-- ARGV[1..6]       see includes/context.lua
-- ARGV[7] limit    bound on each step
-- ARGV[8] grace_ms length of a provisional lease (ms)
-- Returns {1, reclaimed, dead_lettered, adopted, promoted, orphans_found}.
-- FLAGS: allow-oom (a full server still runs it: recovery never stops)
-- MEMO: reply
-- Errors (includes/check.lua), raised before any write: 'BELAYQ bad argument: <what>';
-- 'BELAYQ not permitted: <command, rule>' when the caller's ACL refuses a command it may run.
-- @include context
-- @include claim_keys
-- @include memo
-- @include ready
-- @include recover

local k = claim_keys()
args_exactly(8)
local limit = int_arg(7, 'limit', 1)
local grace_ms = int_arg(8, 'grace_ms', 1)
local now = now_ms()
local earlier = earlier_reply(k.memo, k.memo_exp, now)
if earlier then
  for j = 1, #earlier do earlier[j] = tonumber(earlier[j]) end
  return earlier
end

local reclaimed, died, adopted = sweep_expired(k, now, limit)
local orphans = adopt_landing(k, now, limit, grace_ms)
local promoted = promote_due(k, now, limit)
memo_trim(k.memo, k.memo_exp, now, limit)
fix_door(k.levels)
local out = {1, reclaimed, died, adopted, promoted, orphans}
if reclaimed + died + adopted + promoted + orphans > 0 then
  remember(k.memo, k.memo_exp, out, now)
end
return out
