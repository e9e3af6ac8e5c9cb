-- complete: store the response of a finished request and free its lease.
--
-- KEYS[1]  record hash   {prefix}:{<digest>}, the only key (the lease is its field "lease")
-- ARGV[1]  owner         the token the claim returned (32 hex digits from idemkey)
-- ARGV[2]  resp          encoded response (version byte + msgpack)
-- ARGV[3]  retention_ms  how long the completed record is replayed, milliseconds
-- ARGV[4]  tag           12 characters the completed record keeps of the owner, computed by
--                        idemkey._core.owner_tag (the only place it is computed)
-- ARGV[5]  fence         optional (may be ""); the fence the claim returned, to tell a lost
--                        record (below)
-- ARGV[6]  grace_ms      optional; > 0: also write the tombstone {prefix}:{<digest>}:gone
--                        (KEYS[1] .. ":gone", the same slot): the claim's whole fingerprint
--                        then the completion time (Unix ms, server clock, 13 digits), living
--                        retention_ms + grace_ms, so it outlives the record by the grace
--                        (Policy.expired_grace; claim.lua answers it). pcall: a node serving
--                        a migrating slot refuses a key it does not hold, and the response
--                        must be stored all the same; a record completed then has none
-- ARGV[7]  keep_origin   optional; "1": keep the origin claim.lua kept (fields "i", "i1" ...,
--                        with the client's key; Policy.keep_key_after_completion)
--
-- Wake-up: when record field "w" is set, also writes the stream {prefix}:{<digest>}:done
--          (KEYS[1] .. ":done", the same slot), see the end of this script.
--
-- Reply: 1 stored (or already stored by this owner), 0 lost: another owner took the record over
-- after our lease lapsed, and nothing was written; -1 (only with ARGV[5]) the record was lost
-- under the claim, as renew.lua tells it (gone, or created afresh after our claim: see f0),
-- and nothing was written: a record is never re-created here from what a completion knows
-- (its fingerprint and fence went with it, so a retry would be refused or fenced wrongly).
--
-- The completed record keeps only what a replay and a re-sent complete need: "resp", and "fp"
-- with a 12-character tag of the owner appended, what a re-sent complete is recognised by: 48
-- random bits of one of idemkey's owners. The claim's fields, the finished steps, the step
-- attempt counts ("na", "a:<name>", attempt.lua) and the lease go: a replay needs only the
-- response. Without "state", a record is complete when it has "resp".
-- "i", "i1" ..., the origin claim.lua kept (when and where from, and the client's key), go too
-- unless ARGV[7] says keep them: they would cost a completed record 64 bytes or more, past its
-- memory goal (docs/design.md), and an operator looks for the records that are not complete.
--
-- The record is never deleted and created again (it keeps "fp" throughout): in a cluster slot
-- being migrated, a script may only touch keys that exist, so re-creating it would fail
-- mid-script, after the delete had run.
--
-- The owner field, not the lease, decides: a lease that lapsed without anyone taking over still
-- lets its owner complete, since no one else ran the work.

-- Whether another owner's claim in progress, whose record holds fence "current" and first
-- fence "first" (claim.lua's f0), is on a record created after the claim of fence "ours": the
-- record ours held vanished (evicted, deleted, lost in a restart or a failover) and was
-- created afresh. A record without f0 (written before 0.3) tells it by a fence not above ours,
-- as fences then counted claims; so does one whose f0 is no number (stored bytes are input).
-- As in renew.lua.
local function lost_under(current, first, ours)
  first = tonumber(first)
  if first then
    return first > ours
  end
  return (tonumber(current) or 0) <= ours
end

local record = redis.call("HMGET", KEYS[1], "owner", "state", "fp", "ns", "w", "na")
-- The tag comes with the call: the same owner always sends the same tag, so a re-sent complete
-- is recognised by it.
local tag = ARGV[4]
if record[1] == ARGV[1] and record[2] == "in_progress" then
  -- The claim's fields go first, "at" among them: written by idemkey before 0.2, remove in 0.4.
  -- They go while the hash is still a small listpack: deleted after the response turned it into
  -- a hash table, they would leave that table at twice the slots, 32 bytes more per record, as
  -- Redis does not shrink it.
  -- "w": the waiters' mark (below) goes with them, and "i", "i1" ..., the claim's origin,
  -- unless ARGV[7] says keep it. "f0" (claim.lua) and "ro" (release.lua) go with the fence.
  if ARGV[7] == "1" then
    redis.call("HDEL", KEYS[1], "state", "owner", "lease", "fence", "f0", "ro", "tk", "at", "w")
  else
    redis.call("HDEL", KEYS[1], "state", "owner", "lease", "fence", "f0", "ro", "tk", "at", "w",
      "i", "i1", "i2", "i3", "i4", "i5", "i6", "i7", "i8", "i9", "i10", "i11", "i12", "i13", "i14",
      "i15")
  end
  if record[4] or record[6] then  -- finished steps, attempt counts: their fields go too
    local fields = redis.call("HKEYS", KEYS[1])
    for i = 1, #fields do
      local kind = string.sub(fields[i], 1, 2)
      if kind == "s:" or kind == "a:" then
        redis.call("HDEL", KEYS[1], fields[i])
      end
    end
    redis.call("HDEL", KEYS[1], "ns", "na")
  end
  redis.call("HSET", KEYS[1], "fp", (record[3] or "") .. tag, "resp", ARGV[2])
  redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[3]))
  local grace = tonumber(ARGV[6])
  if grace and grace > 0 and record[3] then
    local now = redis.call("TIME")
    local ms = now[1] * 1000 + math.floor(now[2] / 1000)
    -- The whole fingerprint (any length: claim.lua reads the time as the last 13 digits).
    redis.pcall("SET", KEYS[1] .. ":gone", record[3] .. string.format("%013d", ms),
      "PX", tonumber(ARGV[3]) + grace)
  end
  -- Wake-up: when a waiter marked the record (claim.lua), post one entry to the done stream
  -- {prefix}:{<digest>}:done, where waiters block with XREAD from id 0 (so one that reads after
  -- this still sees it). It lives 10 s: it only has to outlast the gap between a waiter's
  -- in-flight reply and its XREAD. pcall: the stream is a hint (waiters also wake when their
  -- read times out), and the response is stored already.
  if record[5] then
    local done = KEYS[1] .. ":done"
    redis.pcall("XADD", done, "MAXLEN", 1, "*", "end", "complete")
    redis.pcall("PEXPIRE", done, 10000)
  end
  return 1
end

-- Not ours in progress. Ours already (a re-send after a lost reply) answers 1 again.
if record[2] == "complete" then  -- completed before 0.2, the full owner kept: remove in 0.4
  if record[1] == ARGV[1] then
    return 1
  end
  return 0
end
if not record[2] and record[3] and string.sub(record[3], -12) == tag
    and redis.call("HEXISTS", KEYS[1], "resp") == 1 then
  return 1
end
-- Lost, or another owner's? (as in renew.lua)
local fence = tonumber(ARGV[5])
if fence then
  if record[2] == "in_progress" then  -- another owner's claim
    local fences = redis.call("HMGET", KEYS[1], "fence", "f0")
    if lost_under(fences[1], fences[2], fence) then
      return -1
    end
  elseif redis.call("EXISTS", KEYS[1]) == 0 then
    return -1
  end
end
return 0
