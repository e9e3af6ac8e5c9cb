-- complete: store the response of a finished request and free its lease.
--
-- KEYS[1]  record hash   {prefix}:{<digest>}
-- KEYS[2]  lock string   {prefix}:{<digest>}:lock
-- ARGV[1]  owner         the token the claim returned
-- ARGV[2]  resp          encoded response (version byte + msgpack)
-- ARGV[3]  retention_ms  how long the completed record is replayed, milliseconds
--
-- Wake-up: when record field "w" is set, also writes the stream {prefix}:{<digest>}:done
--          (KEYS[1] .. ":done", the same slot), see the end of this script.
--
-- Reply: 1 stored (or already stored by this owner), 0 lost: another owner took the record over
-- after our lease lapsed, and nothing was written.
--
-- Finished steps ("ns", "s:<name>", see checkpoint.lua) are dropped: the stored response is
-- all a replay needs.
--
-- The owner field, not the lock, decides: a lease that lapsed without anyone taking over still
-- lets its owner complete, since no one else ran the work.

if redis.call("HGET", KEYS[1], "owner") ~= ARGV[1] then
  return 0
end
if redis.call("HGET", KEYS[1], "state") == "complete" then
  return 1
end
if redis.call("GET", KEYS[2]) == ARGV[1] then
  redis.call("DEL", KEYS[2])
end
if redis.call("HEXISTS", KEYS[1], "ns") == 1 then
  local fields = redis.call("HKEYS", KEYS[1])
  for i = 1, #fields do
    if string.sub(fields[i], 1, 2) == "s:" then
      redis.call("HDEL", KEYS[1], fields[i])
    end
  end
  redis.call("HDEL", KEYS[1], "ns")
end
local now = redis.call("TIME")
redis.call("HSET", KEYS[1], "state", "complete", "resp", ARGV[2],
  "at", now[1] .. string.format("%03d", math.floor(now[2] / 1000)))
redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[3]))
-- Wake-up: when a waiter marked the record (claim.lua), post one entry to the done stream
-- {prefix}:{<digest>}:done, where waiters block with XREAD from id 0 (so one that reads after
-- this still sees it). It lives 10 s: it only has to outlast the gap between a waiter's
-- in-flight reply and its XREAD. The record is final, so the mark goes. pcall: the stream is a
-- hint (waiters also wake when their read times out), and the response is stored already.
if redis.call("HDEL", KEYS[1], "w") == 1 then
  local done = KEYS[1] .. ":done"
  redis.pcall("XADD", done, "MAXLEN", 1, "*", "end", "complete")
  redis.pcall("PEXPIRE", done, 10000)
end
return 1
