-- release: give up a claim that did not produce a stored answer, so a retry runs afresh.
--
-- KEYS[1]  record hash   {prefix}:{<digest>}, the only key (the lease is its field "lease")
-- ARGV[1]  owner         the token the claim returned
--
-- Wake-up: when record field "w" is set, also writes the stream {prefix}:{<digest>}:done
--          (KEYS[1] .. ":done", the same slot), see the end of this script.
--
-- Finished steps ("ns", "s:<name>", see checkpoint.lua) are kept, and with them "fp": the
-- retry resumes after the last finished step, and the key stays bound to its payload. Step
-- attempt counts ("na", "a:<name>", see attempt.lua) go: a retry of the call counts afresh.
--
-- Reply: 1 released, or released by this owner already (a re-send after a lost reply: the
-- record keeps the releasing owner in "ro" until it completes); 0 not ours (taken over,
-- released by another owner, or complete: untouched).
--
-- The fence and f0 stay behind (until the record's TTL): fencing tokens handed to downstream
-- systems must keep growing, even across a release and a fresh claim.
--
-- Invariants: reads and checks first, writes last. Running it twice with the same owner
-- answers 1 both times and writes once.

local record = redis.call("HMGET", KEYS[1], "owner", "state", "ns", "w", "na", "ro")
if record[1] ~= ARGV[1] or record[2] ~= "in_progress" then
  -- Released by us already: the same answer. The next claim's release overwrites "ro", and
  -- complete.lua drops it.
  if record[6] == ARGV[1] then
    return 1
  end
  return 0
end
-- "at": written by idemkey before 0.2, dropped with the claim it described. Reading 0.1
-- records: remove in 0.4.
if record[3] then
  redis.call("HDEL", KEYS[1], "state", "owner", "lease", "tk", "at")
else
  redis.call("HDEL", KEYS[1], "state", "fp", "owner", "lease", "tk", "at")
end
redis.call("HSET", KEYS[1], "ro", ARGV[1])
if record[5] then
  local fields = redis.call("HKEYS", KEYS[1])
  for i = 1, #fields do
    if string.sub(fields[i], 1, 2) == "a:" then
      redis.call("HDEL", KEYS[1], fields[i])
    end
  end
  redis.call("HDEL", KEYS[1], "na")
end
-- Wake-up: as in complete.lua, waiters that marked the record are woken to claim it. The mark
-- "w" stays: a waiter that reads the stream after the next claim dropped it is woken when
-- that claim ends.
if record[4] then
  local done = KEYS[1] .. ":done"
  redis.pcall("XADD", done, "MAXLEN", 1, "*", "end", "release")
  redis.pcall("PEXPIRE", done, 10000)
end
return 1
