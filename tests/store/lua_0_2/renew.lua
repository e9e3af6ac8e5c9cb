-- renew: extend a live claim's lease (the heartbeat).
--
-- KEYS[1]  record hash   {prefix}:{<digest>}
-- KEYS[2]  lock string   {prefix}:{<digest>}:lock
-- ARGV[1]  owner         the token the claim returned
-- ARGV[2]  lease_ms      new lease length from now, milliseconds
-- ARGV[3]  fence         optional; the fence the claim returned, to tell a lost record (below)
--
-- Reply: 1 the lease is ours for lease_ms more; 0 it is not (taken over, released, complete);
--        -1 (only with ARGV[3]) the record was lost under the claim: the hash is gone, or it
--        is in progress for another owner with a fence not above ours, so it was claimed
--        afresh after it vanished (evicted or deleted; a takeover always raises the fence).
--
-- A lease that lapsed while nobody took over is taken back: the record still names us, so no
-- one else ran the work.
--
-- The record lives at least as long as the lease: a body that outruns the retention must not
-- lose its record under a live claim (its complete would be refused, and once the lock lapsed
-- the next caller would run the work again, with the fence back at 1).
--
-- Invariants: reads and checks first, writes last. The record decides, not the lock: the lock
-- is set or extended only for the owner the record names in progress, so a lock whose record
-- is gone is never kept alive (it lapses by itself). Reading the record also marks it used,
-- so an LRU eviction policy takes a live claim's record after idle ones (not a guarantee).
-- Running it twice with the same owner answers the same.

local holder = redis.call("GET", KEYS[2])
local record = redis.call("HMGET", KEYS[1], "owner", "state", "fence")
if record[1] == ARGV[1] and record[2] == "in_progress" and (not holder or holder == ARGV[1]) then
  redis.call("SET", KEYS[2], ARGV[1], "PX", tonumber(ARGV[2]))
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
    if (tonumber(record[3]) or 0) <= fence then
      return -1
    end
  elseif redis.call("EXISTS", KEYS[1]) == 0 then
    return -1
  end
end
return 0
