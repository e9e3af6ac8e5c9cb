-- claim: decide what a request with an idempotency key does, in one round trip.
--
-- KEYS[1]  record hash   {prefix}:{<digest>}, the only key: field "lease" holds a live claim's
--                        deadline (server clock, Unix ms), so a slot being migrated serves
--                        the script through ASK redirection (docs/design.md, "One key")
-- ARGV[1]  fp            request fingerprint (16 raw bytes from idemkey; any string works, the
--                        tombstone's comparison included)
-- ARGV[2]  owner         fresh random token of the caller (32 hex digits from idemkey)
-- ARGV[3]  lease_ms      lease length, milliseconds
-- ARGV[4]  retention_ms  how long the record lives, milliseconds
-- ARGV[5]  waits         optional; "1": the caller waits for an in-flight claim to end
--                        (wake-up: record field "w", stream {prefix}:{<digest>}:done)
-- ARGV[6]  expired       optional; "1": answer an expired key's tombstone (Policy.expired_grace):
--                        {prefix}:{<digest>}:gone (KEYS[1] .. ":gone", the same slot), a string
--                        of the whole fingerprint then the completion time (Unix ms, 13
--                        digits), written by complete.lua; read only when the record is gone
-- ARGV[7]  origin        optional; "<method> <route>\n<scope>", then "\nk:<escaped key>;"
--                        unless Policy(keep_keys=False) (idemkey/_core/_origin.py), kept after
--                        the claim's time as "<server clock, Unix ms> <origin>" (the clock the
--                        lease, the fence and a completion's time are on: no client clock),
--                        in fields "i", "i1" ... "i15", 64 bytes each at most (a longer
--                        value would make the hash a hash table for good; cut after 1 KiB),
--                        from a fresh claim on (release leaves them, complete drops them
--                        unless told to keep them), so store.records() can filter, age and
--                        name the records, which their digest cannot
--
-- Wake-up: a fresh claim of a record that existed deletes {prefix}:{<digest>}:done
--          (KEYS[1] .. ":done", the same slot), see complete.lua.
-- Hints: the done stream, the tombstone and a 0.2 claim's lock string
--        ({prefix}:{<digest>}:lock) are other keys of the same slot, touched with pcall
--        only: a node serving a migrating slot refuses a key it does not hold, and a hint
--        must never stop the claim.
--
-- Record fields, in progress: fp, state = "in_progress", owner, lease (deadline, Unix ms on the
-- server's clock), fence (below), f0 (the fence the record was created with: renew.lua and
-- complete.lua tell by it a record claimed afresh after ours vanished), tk = 1
-- when the claim took over a lapsed one (a re-sent claim must answer the same), and "ns" /
-- "s:<name>", the count and results of finished steps (checkpoint.lua), "i", "i1", ... the
-- origin (ARGV[7]).
-- Released: fence and f0, plus fp and the steps when there are steps (the key stays bound to its
-- payload), and "ro", the releasing owner (release.lua). Complete (written by complete.lua): only
-- resp, and fp followed by the 12-character
-- tag of the completing owner.
-- Records written before 0.2 may hold a 32-hex fp, and state = "complete" with the full owner,
-- fence, tk and "at": both are read here as before. Reading 0.1 records: remove in 0.4.
--
-- Reply, first element a tag:
--   {1, fence, takeover, name1, result1, ...}
--                         claimed: run the work; takeover = 1 when a lapsed claim was taken over,
--                         2 when a released (or cancelled) record was claimed again, 0 when the
--                         record is new (Redis holds nothing of the key: a new key, or one whose
--                         record expired or was lost); then the finished steps (name without
--                         "s:", stored result), if any
--   {2, resp}             replay: the record is complete, resp is the stored response
--   {3, left_ms}          in flight: another owner holds the lease for left_ms more
--   {4}                   mismatch: the key was used with another fingerprint
--   {5, completed_ms}     expired: the record is gone, its tombstone has this fingerprint; it
--                         completed at completed_ms (Unix time, ms). Nothing is written.
--   {6, type}             not a record: KEYS[1] holds a key of another type (TYPE's answer:
--                         "string", "list", ...), a stranger's or damage. Nothing is written;
--                         forget.lua deletes it.
--
-- Fence: max(stored fence + 1, server clock in microseconds), written with %d (a number's
-- tostring would print 1.7e+15). It grows with every claim of a record, whatever the clock
-- does; and a record that is gone (expired, evicted, lost in a restart or a failover) is
-- claimed with the clock, above every fence the key handed out as long as the clock of the
-- node that serves the claim is past the clock of the key's last claim (docs/guarantees.md).
-- Microseconds since 1970 are about 1.8e15, exact in Lua's doubles (2^53 is 9e15: year 2255).
--
-- Invariants: reads and checks first, writes last. Running it twice with the same owner
-- (redis-py re-sends a command after a timeout) answers claimed both times and writes once.
-- A completed record is never written here. The lease is only ever written together with the
-- owner field (here) or for the owner the field names (renew), so it is that owner's.
--
-- Claims written by 0.2 keep their lease in the lock string {prefix}:{<digest>}:lock instead
-- (an in-progress record without "lease"): its PTTL is read, so such a claim stays in flight
-- until it lapses, as under 0.2. Reading 0.2 claims: remove in 0.4.

-- Two reads: a replay (the common repeat) reads only the fields it needs; the rest are read
-- when the call goes on to claim, and only from a record that has any (measured:
-- benchmarks/record_cost.py). "fence" comes first because every record but a new key has it.
-- pcall: a key of another type at the record's name (WRONGTYPE) is told apart from Redis
-- failing, which the client answers by running the work under on_store_error="open" or with
-- "retry the same key"; TYPE is asked only then, so the usual read costs nothing more.
local head = redis.pcall("HMGET", KEYS[1], "resp", "fp", "state", "fence")
if head.err then
  local kind = redis.call("TYPE", KEYS[1]).ok
  if kind ~= "hash" and kind ~= "none" then
    return {6, kind}
  end
  return head  -- any other error, as redis.call would have raised it
end
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
  local gone = redis.pcall("GET", KEYS[1] .. ":gone")
  if type(gone) == "string" then
    -- The fingerprint, whole, then the completion time in 13 digits (as complete.lua writes
    -- it, for every fingerprint length: a 16-byte fingerprint gives 0.2's layout).
    if #gone >= 13 and string.sub(gone, 1, -14) == ARGV[1] then
      return {5, tonumber(string.sub(gone, -13)) or 0}
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
local record = {false, false, false, false, false, false}
if fp or state or head[4] then
  record = redis.call("HMGET", KEYS[1], "owner", "fence", "tk", "ns", "lease", "f0")
end
local in_progress = state == "in_progress"
-- The server's clock: the deadline is compared with the clock that wrote it (a replica that
-- takes over after a failover has its own, as for a PX expiry). Redis before 7.0 replicates
-- a script's effects, not the script, only when asked; 7.0 and later always do.
if redis.replicate_commands then
  redis.replicate_commands()
end
local time = redis.call("TIME")
local now = time[1] * 1000 + math.floor(time[2] / 1000)
local now_us = time[1] * 1000000 + time[2]
local lease_ms = tonumber(ARGV[3])
local deadline = tonumber(record[5])
if in_progress and not deadline then
  -- A claim written by 0.2: its lease is the lock string's PTTL (-2: lapsed). A node that
  -- cannot read it (the slot half migrated) answers in flight for a second, not a takeover.
  local left = redis.pcall("PTTL", KEYS[1] .. ":lock")
  if type(left) ~= "number" then
    left = 1000
  end
  deadline = now + (left == -1 and lease_ms or left)
end
local fence, takeover
if in_progress and record[1] == ARGV[2] then
  -- Our own claim, sent again: the same answer (fence and takeover flag: "tk" after a
  -- takeover, else 0 when the record was created by this claim, f0 being its fence, and 2 when
  -- it existed); a lease that lapsed meanwhile is taken back, as nobody else claimed (that
  -- would change the owner).
  if deadline <= now then
    redis.call("HSET", KEYS[1], "lease", now + lease_ms)
  end
  fence = tonumber(record[2]) or 0
  takeover = tonumber(record[3]) or (record[6] == record[2] and 0 or 2)
elseif in_progress and deadline > now then
  -- In flight: another owner holds the lease.
  -- Wake-up: a caller that will wait marks the record ("w"), so the complete or release that
  -- ends this claim posts to the done stream its XREAD blocks on (complete.lua, release.lua).
  if ARGV[5] == "1" then
    redis.call("HSET", KEYS[1], "w", 1)
  end
  return {3, deadline - now}
else
  -- The HSET below is this branch's first write, on every path: Redis refuses a script's
  -- write for a full server (maxmemory, noeviction) only while the script has written nothing,
  -- so a DEL or HDEL before it let a takeover through a server that refused the owner's
  -- renewal (the work ran twice). Full, a takeover is refused as a new key's claim is.
  -- The lease was free and is ours now: a new key, a key released after a failure, or a
  -- crashed owner's lapsed lease (state still in_progress: a takeover). The fence grows (see
  -- the header): above the stored one, and at least the clock when nothing is stored.
  local stored = tonumber(record[2])
  fence = math.max((stored or 0) + 1, now_us)
  local text = string.format("%d", fence)
  -- One HSET for every field the claim writes (the origin, ARGV[7], included).
  local fields = {"state", "in_progress", "fp", ARGV[1], "owner", ARGV[2], "lease", now + lease_ms,
    "fence", text}
  takeover = 2
  if in_progress then
    takeover = 1
    fields[#fields + 1], fields[#fields + 2] = "tk", 1
  elseif not stored then
    -- A record created now (nothing of the key in Redis): its first fence.
    takeover = 0
    fields[#fields + 1], fields[#fields + 2] = "f0", text
  end
  local pieces = 0
  if ARGV[7] then
    -- The origin in pieces of 64 bytes ("i", "i1", ...; idemkey/_core/_origin.py).
    local origin = string.format("%d ", now) .. ARGV[7]
    for n = 0, 15 do
      local piece = string.sub(origin, n * 64 + 1, n * 64 + 64)
      if piece == "" then
        break
      end
      fields[#fields + 1], fields[#fields + 2] = n == 0 and "i" or "i" .. n, piece
      pieces = n + 1
    end
  end
  redis.call("HSET", KEYS[1], unpack(fields))
  redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[4]))
  if record[2] then
    -- A record claimed before: the pieces of its earlier origin past this one's (it may have
    -- been longer) go.
    if ARGV[7] then
      local stale = {}
      for n = pieces, 15 do
        stale[#stale + 1] = n == 0 and "i" or "i" .. n
      end
      if #stale > 0 then
        redis.call("HDEL", KEYS[1], unpack(stale))
      end
    end
    -- Wake-up: a record claimed again (after a release or a lapse) drops the done stream of
    -- the claim before, so waiters block until this claim ends; the mark "w" stays for them.
    -- A new key (no fence yet) has no stream: nothing to do. pcall: the stream is a hint.
    redis.pcall("DEL", KEYS[1] .. ":done")
  end
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
