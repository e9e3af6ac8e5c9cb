-- claim: decide what a request with an idempotency key does, in one round trip.
--
-- KEYS[1]  record hash   {prefix}:{<digest>}
-- KEYS[2]  lock string   {prefix}:{<digest>}:lock  holds the owner token while a claim is live
-- ARGV[1]  fp            request fingerprint (16 raw bytes from idemkey; any string works)
-- ARGV[2]  owner         fresh random token of the caller (32 hex digits from idemkey)
-- ARGV[3]  lease_ms      lease length, milliseconds
-- ARGV[4]  retention_ms  how long the record lives, milliseconds
-- ARGV[5]  waits         optional; "1": the caller waits for an in-flight claim to end
--                        (wake-up: record field "w", stream {prefix}:{<digest>}:done)
-- ARGV[6]  expired       optional; "1": answer an expired key's tombstone (Policy.expired_grace):
--                        {prefix}:{<digest>}:gone (KEYS[1] .. ":gone", the same slot), a string
--                        of the fingerprint (16 bytes) then the completion time (Unix ms),
--                        written by complete.lua; read only when the record is gone
-- ARGV[7]  origin        optional; "<claimed at, unix ms> <method> <route>\n<scope>", kept in
--                        field "i" from a fresh claim on (release leaves it, complete drops
--                        it), so store.records() can filter and age the records that are not
--                        complete, which their digest cannot name
--
-- Wake-up: a fresh claim of a record that existed deletes {prefix}:{<digest>}:done
--          (KEYS[1] .. ":done", the same slot), see complete.lua.
--
-- Record fields, in progress: fp, state = "in_progress", owner, fence (claims so far), tk = 1
-- when the claim took over a lapsed one (a re-sent claim must answer the same), and "ns" /
-- "s:<name>", the count and results of finished steps (checkpoint.lua), "i" the origin (ARGV[7]).
-- Released: fence, plus fp and the steps when there are steps (the key stays bound to its
-- payload). Complete (written by complete.lua): only resp, and fp followed by the 12-character
-- tag of the completing owner.
-- Records written before 0.2 may hold a 32-hex fp, and state = "complete" with the full owner,
-- fence, tk and "at": both are read here as before. Reading 0.1 records: remove in 0.4.
--
-- Reply, first element a tag:
--   {1, fence, takeover, name1, result1, ...}
--                         claimed: run the work; takeover = 1 when a lapsed claim was taken over;
--                         then the finished steps (name without "s:", stored result), if any
--   {2, resp}             replay: the record is complete, resp is the stored response
--   {3, pttl_ms}          in flight: another owner holds the lease for pttl_ms more
--   {4}                   mismatch: the key was used with another fingerprint
--   {5, completed_ms}     expired: the record is gone, its tombstone has this fingerprint; it
--                         completed at completed_ms (Unix time, ms). Nothing is written.
--
-- Invariants: reads and checks first, writes last. Running it twice with the same owner
-- (redis-py re-sends a command after a timeout) answers claimed both times and writes once.
-- A completed record is never written here. The lock is only ever set together with the
-- owner field (here) or for the owner the field names (renew), so it holds that owner or nothing.

-- Two reads: a replay (the common repeat) reads only the fields it needs; the rest are read
-- when the call goes on to claim, and only from a record that has any (measured:
-- benchmarks/record_cost.py). "fence" comes first because every record but a new key has it.
local head = redis.call("HMGET", KEYS[1], "resp", "fp", "state", "fence")
local resp, fp, state = head[1], head[2], head[3]

-- A complete record's fp ends with the 12-character owner tag, which is not part of the
-- comparison. A record completed before 0.2 says state = "complete" and holds the bare fp:
-- that branch reads 0.1 records, remove in 0.4.
if resp and fp and state ~= "complete" then
  fp = string.sub(fp, 1, -13)
end
-- Is the stored fingerprint this request's? Compared as sent; a record written before 0.2
-- holds 32 hex digits where idemkey now sends 16 bytes, compared in hex when the bytes differ;
-- that hex comparison reads 0.1 records, remove in 0.4.
-- One comparison for every state (HMGET gives false for a missing field).
local same = fp == ARGV[1] or (fp and #fp == 32 and #ARGV[1] == 16
  and fp == string.format(string.rep("%02x", 16), string.byte(ARGV[1], 1, 16)))
if resp then
  if same then
    return {2, resp}
  end
  return {4}
end
-- No record: an expired key's tombstone, when the caller asks, answers instead of a new claim.
if ARGV[6] == "1" and not fp and not state then
  local gone = redis.call("GET", KEYS[1] .. ":gone")
  if gone then
    if string.sub(gone, 1, 16) == ARGV[1] then
      return {5, tonumber(string.sub(gone, 17)) or 0}
    end
    return {4}
  end
end
-- fp without a state: released with finished steps, still bound to its payload.
if fp and not same then
  return {4}
end

-- A new key (no fp, state nor fence: a released record keeps its fence, steps only live on a
-- claimed record) has none of the claim's fields: nothing more to read.
local record = {false, false, false, false}
if fp or state or head[4] then
  record = redis.call("HMGET", KEYS[1], "owner", "fence", "tk", "ns")
end
local in_progress = state == "in_progress"
local fence, takeover
if in_progress and record[1] == ARGV[2] then
  -- Our own claim, sent again: the same answer (fence and takeover flag, kept in "tk"); a lock
  -- that lapsed meanwhile is taken back, as nobody else claimed (that would change the owner).
  if not redis.call("GET", KEYS[2]) then
    redis.call("SET", KEYS[2], ARGV[2], "PX", tonumber(ARGV[3]))
  end
  fence, takeover = tonumber(record[2]) or 0, tonumber(record[3]) or 0
else
  if not redis.call("SET", KEYS[2], ARGV[2], "NX", "PX", tonumber(ARGV[3])) then
    -- In flight: another owner holds the lease.
    -- Wake-up: a caller that will wait marks the record ("w"), so the complete or release that
    -- ends this claim posts to the done stream its XREAD blocks on (complete.lua, release.lua).
    -- Only a live record is marked: a lone "w" would make a hash without a TTL.
    if ARGV[5] == "1" and state then
      redis.call("HSET", KEYS[1], "w", 1)
    end
    return {3, redis.call("PTTL", KEYS[2])}
  end
  -- Wake-up: a record claimed again (after a release or a lapse) drops the done stream of the
  -- claim before, so waiters block until this claim ends; the mark "w" stays for them. A new
  -- key (no fence yet) has no stream: nothing to do. pcall: the stream is a hint, and a node
  -- that refuses it (its slot half migrated) must not stop the claim.
  if record[2] then
    redis.pcall("DEL", KEYS[1] .. ":done")
  end
  -- The lock was free and is ours now: a new key, a key released after a failure, or a
  -- crashed owner's lapsed lease (state still in_progress: a takeover, which bumps the fence).
  fence = (tonumber(record[2]) or 0) + 1
  -- One HSET for every field the claim writes (the origin, ARGV[7], included).
  local fields = {"state", "in_progress", "fp", ARGV[1], "owner", ARGV[2], "fence", fence}
  takeover = 0
  if in_progress then
    takeover = 1
    fields[#fields + 1], fields[#fields + 2] = "tk", 1
  end
  if ARGV[7] then
    fields[#fields + 1], fields[#fields + 2] = "i", ARGV[7]
  end
  redis.call("HSET", KEYS[1], unpack(fields))
  redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[4]))
end

-- Claimed. The finished steps follow, read only when "ns" says there are any.
local reply = {1, fence, takeover}
if record[4] then
  local fields = redis.call("HGETALL", KEYS[1])
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 2) == "s:" then
      reply[#reply + 1] = string.sub(fields[i], 3)
      reply[#reply + 1] = fields[i + 1]
    end
  end
end
return reply
