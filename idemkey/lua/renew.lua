-- renew: extend a live claim's lease (the heartbeat).
--
-- KEYS[1]  record hash   {prefix}:{<digest>}
-- KEYS[2]  lock string   {prefix}:{<digest>}:lock
-- ARGV[1]  owner         the token the claim returned
-- ARGV[2]  lease_ms      new lease length from now, milliseconds
--
-- Reply: 1 the lease is ours for lease_ms more, 0 it is not (taken over, released, complete).
--
-- A lease that lapsed while nobody took over is taken back: the record still names us, so no
-- one else ran the work.
--
-- The record lives at least as long as the lease: a body that outruns the retention must not
-- lose its record under a live claim (its complete would be refused, and once the lock lapsed
-- the next caller would run the work again, with the fence back at 1).

local holder = redis.call("GET", KEYS[2])
local function keep_record()
  local ttl = redis.call("PTTL", KEYS[1])  -- -1: no expiry, -2: gone; both left alone
  if ttl >= 0 and ttl < tonumber(ARGV[2]) then
    redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[2]))
  end
end

if holder == ARGV[1] then
  redis.call("PEXPIRE", KEYS[2], tonumber(ARGV[2]))
  keep_record()
  return 1
end
if holder then
  return 0
end
local record = redis.call("HMGET", KEYS[1], "owner", "state")
if record[1] == ARGV[1] and record[2] == "in_progress" then
  redis.call("SET", KEYS[2], ARGV[1], "PX", tonumber(ARGV[2]))
  keep_record()
  return 1
end
return 0
