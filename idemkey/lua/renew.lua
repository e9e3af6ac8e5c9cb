-- renew: extend a live claim's lease (the heartbeat).
--
-- KEYS[1]  record hash   {prefix}:{<digest>}, the only key: field "lease" is the claim's
--                        deadline (server clock, Unix ms), see claim.lua
-- ARGV[1]  owner         the token the claim returned
-- ARGV[2]  lease_ms      new lease length from now, milliseconds
-- ARGV[3]  fence         optional; the fence the claim returned, to tell a lost record (below)
--
-- Reply: 1 the lease is ours for lease_ms more; 0 it is not (taken over, released, complete);
--        -1 (only with ARGV[3]) the record was lost under the claim: the hash is gone, or it
--        is in progress for another owner on a record created after our claim (its first
--        fence, f0, is above ours), so it was claimed afresh after it vanished (evicted,
--        deleted, lost in a restart or a failover). A takeover keeps f0. A record without f0
--        (written before 0.3, when fences counted claims) tells it by a fence not above ours.
--
-- A lease that lapsed while nobody took over is taken back: the record still names us, so no
-- one else ran the work.
--
-- The record lives at least as long as the lease: a body that outruns the retention must not
-- lose its record under a live claim (its complete would be refused, and once the lease lapsed
-- the next caller would run the work again).
--
-- Invariants: reads and checks first, writes last. The lease is extended only for the owner the
-- record names in progress. Reading the record also marks it used,
-- so an LRU eviction policy takes a live claim's record after idle ones (not a guarantee).
-- Running it twice with the same owner answers the same.

local record = redis.call("HMGET", KEYS[1], "owner", "state", "fence", "f0")
if record[1] == ARGV[1] and record[2] == "in_progress" then
  -- As in claim.lua: the server's clock, effects replicated.
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local time = redis.call("TIME")
  redis.call("HSET", KEYS[1], "lease", time[1] * 1000 + math.floor(time[2] / 1000) + tonumber(ARGV[2]))
  local ttl = redis.call("PTTL", KEYS[1])  -- -1: no expiry, left alone
  if ttl >= 0 and ttl < tonumber(ARGV[2]) then
    redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[2]))
  end
  return 1
end

-- Not ours. Lost, or another owner's?
local fence = tonumber(ARGV[3])
if fence then
  if record[2] == "in_progress" and record[1] ~= ARGV[1] then
    -- A first fence that is no number (stored bytes are input) is read as none.
    local lost
    local first = tonumber(record[4])
    if first then
      lost = first > fence
    else
      lost = (tonumber(record[3]) or 0) <= fence
    end
    if lost then
      return -1
    end
  elseif redis.call("EXISTS", KEYS[1]) == 0 then
    return -1
  end
end
return 0
