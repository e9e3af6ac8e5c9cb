-- forget: an operator deletes one record, so the next request with its key runs afresh
-- (``store.forget``, ``idemkey forget``, the console's forget button).
--
-- KEYS[1]  record hash   {prefix}:{<digest>}, the only key (the lease is its field "lease", a
--                        deadline on the server's clock, Unix ms). Its companions are named
--                        from it, in the same slot, and deleted with pcall (a node serving a
--                        half-migrated slot may not hold them, as claim.lua reads them):
--                        KEYS[1] .. ":gone"  the expiry tombstone (Policy.expired_grace): left
--                                            behind, the retry would get key_expired (410)
--                                            instead of running;
--                        KEYS[1] .. ":lock"  a claim written by idemkey 0.2 (remove in 0.4);
--                        KEYS[1] .. ":done"  the wake-up stream of waiters.
-- ARGV[1]  force         "1": delete a record that a live claim holds too (its owner's
--                        completion is then refused, and a duplicate may run alongside it);
--                        "0": refuse it
-- ARGV[2]  seen state    optional: the state the operator was shown ("lapsed", "released":
--                        what the console offers); given, a record found in another state, or
--                        none, is kept
-- ARGV[3]  seen fence    with ARGV[2]: the fence the operator was shown, decimal text ("": it
--                        had none); a record with another fence (claimed since) is kept
--
-- Reply: {deleted, state}  deleted: the number of keys deleted (0: there was nothing);
--                          state: what was found: "complete", "in_progress" (a live claim),
--                          "lapsed" (in progress, its lease passed), "released", "foreign"
--                          (a key of another type: no record, which claim.lua refuses) or ""
--                          (none)
--        {-1, "in_progress"}  refused: a live claim holds the record and ARGV[1] is not "1".
--                          Nothing written.
--        {-2, state}       refused: ARGV[2] was given and the record is not what was shown
--                          (state: what was found, as above). Nothing written.
--
-- Invariants: reads and checks first, writes last. The check and the delete are one script,
-- so a retry that claimed the record since the operator looked is never deleted under it
-- while it runs, nor, with ARGV[2], once it has completed or lapsed again (a new fence).
-- Sent twice, the second finds no record ({0, ""}, or 1 for the wake-up the first wrote). Waiters of an
-- in-progress record (field "w") are woken as release.lua wakes them: they claim it afresh.

-- pcall: a key of another type at the record's name makes every claim of it refuse the key as
-- unreadable, and forget is the remedy, so it must not fail on it (WRONGTYPE) as well.
local record = redis.pcall("HMGET", KEYS[1], "state", "resp", "lease", "w", "fence")
local state = ""
if record.err then
  local kind = redis.call("TYPE", KEYS[1]).ok
  if kind == "hash" or kind == "none" then
    return record  -- any other error, as redis.call would have raised it
  end
  state = "foreign"  -- no claim can hold it: deleted without force
elseif record[2] then  -- a completed record has no state field, only fp and resp
  state = "complete"
elseif record[1] == "in_progress" then
  -- The server's clock, as claim.lua reads it (Redis before 7.0 replicates effects only when
  -- asked).
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local time = redis.call("TIME")
  local now = time[1] * 1000 + math.floor(time[2] / 1000)
  local deadline = tonumber(record[3])
  local live
  if deadline then
    live = deadline > now
  else  -- a claim written by 0.2: its lease is the lock string's PTTL (-2: lapsed)
    local left = redis.pcall("PTTL", KEYS[1] .. ":lock")
    live = type(left) ~= "number" or left ~= -2
  end
  state = live and "in_progress" or "lapsed"
  if live and ARGV[1] ~= "1" then
    return {-1, state}
  end
elseif redis.call("EXISTS", KEYS[1]) == 1 then
  state = "released"
end
-- What the operator was shown: a completed record, or a claim made since (a new fence), is
-- not the record they chose to forget.
if ARGV[2] and (state ~= ARGV[2] or (record[5] or "") ~= ARGV[3]) then
  return {-2, state}
end
local deleted = redis.call("DEL", KEYS[1])
for _, suffix in ipairs({":gone", ":lock", ":done"}) do
  local found = redis.pcall("DEL", KEYS[1] .. suffix)
  if type(found) == "number" then
    deleted = deleted + found
  end
end
if record[4] and record[1] == "in_progress" then
  local done = KEYS[1] .. ":done"
  redis.pcall("XADD", done, "MAXLEN", 1, "*", "end", "forget")
  redis.pcall("PEXPIRE", done, 10000)
end
return {deleted, state}
