-- claim: decide what a request with an idempotency key does, in one round trip.
--
-- KEYS[1]  record hash   {prefix}:{<digest>}       fields fp, state, owner, fence, tk, resp, at
-- KEYS[2]  lock string   {prefix}:{<digest>}:lock  holds the owner token while a claim is live
-- ARGV[1]  fp            request fingerprint (hex)
-- ARGV[2]  owner         fresh random token of the caller
-- ARGV[3]  lease_ms      lease length, milliseconds
-- ARGV[4]  retention_ms  how long the record lives, milliseconds
-- ARGV[5]  waits         optional; "1": the caller waits for an in-flight claim to end
--                        (wake-up: record field "w", stream {prefix}:{<digest>}:done)
--
-- Wake-up: a fresh claim of a record that existed deletes {prefix}:{<digest>}:done
--          (KEYS[1] .. ":done", the same slot), see complete.lua.
--
-- Record fields "ns" and "s:<name>": the count and the results of finished steps (checkpoint.lua).
-- A record released with finished steps keeps its fp, so the key stays bound to its payload.
--
-- Record field "tk" is 1 when the current claim took over a lapsed one (a re-sent claim must
-- answer the same). Record field "at" is the server time of the last claim or completion, in milliseconds.
--
-- Reply, first element a tag:
--   {1, fence, takeover, name1, result1, ...}
--                         claimed: run the work; takeover = 1 when a lapsed claim was taken over;
--                         then the finished steps (name without "s:", stored result), if any
--   {2, resp}             replay: the record is complete, resp is the stored response
--   {3, pttl_ms}          in flight: another owner holds the lease for pttl_ms more
--   {4}                   mismatch: the key was used with another fingerprint
--
-- Invariants: reads and checks first, writes last. Running it twice with the same owner
-- (redis-py re-sends a command after a timeout) answers claimed both times and writes once.
-- A completed record is never written here.

local record = redis.call("HMGET", KEYS[1], "state", "fp", "resp", "fence", "owner", "tk", "ns")
local state, fp, resp = record[1], record[2], record[3]

-- fp without a state: released with finished steps, still bound to its payload.
if fp and fp ~= ARGV[1] then
  return {4}
end
if state == "complete" then
  return {2, resp}
end

-- The claimed reply, with the finished steps appended (only read when "ns" says there are).
local function claimed(fence, takeover)
  local reply = {1, fence, takeover}
  if record[7] then
    local fields = redis.call("HGETALL", KEYS[1])
    for i = 1, #fields, 2 do
      if string.sub(fields[i], 1, 2) == "s:" then
        reply[#reply + 1] = string.sub(fields[i], 3)
        reply[#reply + 1] = fields[i + 1]
      end
    end
  end
  return reply
end

-- Our own claim, sent again: the same answer (fence and takeover flag, kept in "tk"); a lock
-- that lapsed meanwhile is taken back, as nobody else claimed (that would have changed owner).
local holder = redis.call("GET", KEYS[2])
if state == "in_progress" and record[5] == ARGV[2] then
  if not holder then
    redis.call("SET", KEYS[2], ARGV[2], "PX", tonumber(ARGV[3]))
  end
  return claimed(tonumber(record[4]) or 0, tonumber(record[6]) or 0)
end
if holder then
  -- Wake-up: a caller that will wait marks the record ("w"), so the complete or release that
  -- ends this claim posts to the done stream its XREAD blocks on (complete.lua, release.lua).
  -- Only a live record is marked: a lone "w" would make a hash without a TTL.
  if ARGV[5] == "1" and state then
    redis.call("HSET", KEYS[1], "w", 1)
  end
  return {3, redis.call("PTTL", KEYS[2])}
end

-- The lock is free: a new key, a key released after a failure, or a crashed owner's lapsed
-- lease (state still in_progress: a takeover, which bumps the fence).
local takeover = 0
if state == "in_progress" then
  takeover = 1
end
-- Wake-up: a record claimed again (after a release or a lapse) drops the done stream of the
-- claim before, so waiters block until this claim ends; the mark "w" stays for them. A new
-- key (no fence yet) has no stream: nothing to do. pcall: the stream is a hint, and a node
-- that refuses it (its slot half migrated) must not stop the claim.
if record[4] then
  redis.pcall("DEL", KEYS[1] .. ":done")
end
redis.call("SET", KEYS[2], ARGV[2], "PX", tonumber(ARGV[3]))
local fence = redis.call("HINCRBY", KEYS[1], "fence", 1)
local now = redis.call("TIME")
redis.call("HSET", KEYS[1], "state", "in_progress", "fp", ARGV[1], "owner", ARGV[2],
  "tk", takeover, "at", now[1] .. string.format("%03d", math.floor(now[2] / 1000)))
redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[4]))
return claimed(fence, takeover)
