-- release: give up a claim that did not produce a stored answer, so a retry runs afresh.
--
-- KEYS[1]  record hash   {prefix}:{<digest>}
-- KEYS[2]  lock string   {prefix}:{<digest>}:lock
-- ARGV[1]  owner         the token the claim returned
--
-- Wake-up: when record field "w" is set, also writes the stream {prefix}:{<digest>}:done
--          (KEYS[1] .. ":done", the same slot), see the end of this script.
--
-- Finished steps ("ns", "s:<name>", see checkpoint.lua) are kept, and with them "fp": the
-- retry resumes after the last finished step, and the key stays bound to its payload.
--
-- Reply: 1 released, 0 not ours (taken over, already released, or complete: untouched).
--
-- The fence counter stays behind (until the record's TTL): fencing tokens handed to
-- downstream systems must keep growing, even across a release and a fresh claim.

if redis.call("HGET", KEYS[1], "owner") ~= ARGV[1] then
  return 0
end
if redis.call("HGET", KEYS[1], "state") ~= "in_progress" then
  return 0
end
if redis.call("GET", KEYS[2]) == ARGV[1] then
  redis.call("DEL", KEYS[2])
end
if redis.call("HEXISTS", KEYS[1], "ns") == 1 then
  redis.call("HDEL", KEYS[1], "state", "owner", "tk", "resp", "at")
else
  redis.call("HDEL", KEYS[1], "state", "fp", "owner", "tk", "resp", "at")
end
-- Wake-up: as in complete.lua, waiters that marked the record are woken to claim it. The mark
-- "w" stays: a waiter that reads the stream after the next claim dropped it is woken when
-- that claim ends.
if redis.call("HEXISTS", KEYS[1], "w") == 1 then
  local done = KEYS[1] .. ":done"
  redis.pcall("XADD", done, "MAXLEN", 1, "*", "end", "release")
  redis.pcall("PEXPIRE", done, 10000)
end
return 1
