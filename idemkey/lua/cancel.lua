-- cancel: an operator gives up a record's run on purpose (``store.cancel``, ``idemkey cancel``).
--
-- KEYS[1]  record hash   {prefix}:{<digest>}, the only key (the lease is its field "lease"; a
--                        0.2 claim's lock string, KEYS[1] .. ":lock", is deleted with pcall)
-- ARGV[1]  abandon       "1": also drop the finished steps (the next claim runs every step
--                        again, and the key is no longer bound to its payload); "0": keep
--                        them (the next claim resumes after the last finished step)
--
-- Wake-up: when record field "w" is set, also writes the stream {prefix}:{<digest>}:done
--          (KEYS[1] .. ":done", the same slot), as release.lua does.
--
-- Reply: {1, fence}  an in-progress record was cancelled: its owner no longer owns it, so its
--                    checkpoints, renewals and completion are refused from now on (they check
--                    the owner field first); the fence was raised, so fenced downstream writes
--                    can refuse the stale owner too;
--        {2, fence}  a released record with finished steps: released again, steps kept or
--                    dropped as asked, the fence raised;
--        {0}         nothing to cancel: no record, a completed one (use forget), or a
--                    released one without steps (a retry runs afresh anyway). Nothing written.
--
-- Invariants: reads and checks first, writes last. The fence only grows (as release keeps it).
-- Sent twice, the second finds a released record: with steps kept it answers 2 again (and
-- raises the fence once more, which only grows), abandoned it answers 0.

local record = redis.call("HMGET", KEYS[1], "state", "resp", "ns", "na", "w")
local state, steps = record[1], record[3]
if record[2] or (state ~= "in_progress" and not steps) then
  return {0}
end
local reply = state == "in_progress" and 1 or 2
redis.pcall("DEL", KEYS[1] .. ":lock")  -- a claim written by 0.2: remove in 0.4
redis.call("HDEL", KEYS[1], "state", "owner", "lease", "tk", "at")
local fence = redis.call("HINCRBY", KEYS[1], "fence", 1)
if ARGV[1] == "1" or not steps or record[4] then
  local abandon = ARGV[1] == "1" or not steps
  local fields = redis.call("HKEYS", KEYS[1])
  for i = 1, #fields do
    local kind = string.sub(fields[i], 1, 2)
    if kind == "a:" or (abandon and kind == "s:") then
      redis.call("HDEL", KEYS[1], fields[i])
    end
  end
  redis.call("HDEL", KEYS[1], "na")
  if abandon then
    redis.call("HDEL", KEYS[1], "ns", "fp")
  end
end
if record[5] then
  local done = KEYS[1] .. ":done"
  redis.pcall("XADD", done, "MAXLEN", 1, "*", "end", "cancel")
  redis.pcall("PEXPIRE", done, 10000)
end
return {reply, fence}
