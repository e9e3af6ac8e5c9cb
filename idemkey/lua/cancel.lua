-- cancel: an operator gives up a record's run on purpose (``store.cancel``, ``idemkey cancel``).
--
-- KEYS[1]  record hash   {prefix}:{<digest>}, the only key (the lease is its field "lease"; a
--                        0.2 claim's lock string, KEYS[1] .. ":lock", is deleted with pcall)
-- ARGV[1]  abandon       "1": also drop the finished steps (the next claim runs every step
--                        again, and the key is no longer bound to its payload); "0": keep
--                        them (the next claim resumes after the last finished step)
-- ARGV[2]  seen state    optional: the state the operator was shown ("in_progress", "lapsed":
--                        in progress, its lease passed, or "released"); given, a record found
--                        in another state, or none, is kept ("lapsed" and "in_progress" are
--                        one state here: the fence tells a claim made since)
-- ARGV[3]  seen fence    with ARGV[2]: the fence the operator was shown, as stored ("": it
--                        had none); a record with another fence (claimed since) is kept
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
--        {-2, state} refused: ARGV[2] was given and the record is not what was shown (state:
--                    what was found: "in_progress", "released", "complete" or "" for none).
--                    Nothing written.
--        error       "idemkey: record field fence is not an integer ...": the stored fence is
--                    not one HINCRBY adds 1 to (stored bytes are input). Nothing written: the
--                    claim stays its owner's (redis-py raises ResponseError, the store
--                    StoreError).
--
-- Invariants: reads and checks first, writes last: the fence is checked before the first
-- write, as HINCRBY failing after the HDEL would leave a live claim without its owner. The
-- fence only grows (as release keeps it). The check of ARGV[2] and the cancel are one script,
-- so a retry that took a lapsed claim over while the operator was asked keeps its run.
-- Sent twice, the second finds a released record: with steps kept it answers 2 again (and
-- raises the fence once more, which only grows), abandoned it answers 0.

-- Whether HINCRBY adds 1 to a stored field: absent (it counts from 0), or an integer as Redis
-- reads one (digits after an optional "-", no leading zero, nothing else) within 64 bits and
-- below their maximum (one more would overflow). As in checkpoint.lua and attempt.lua.
local function counter(value)
  if not value or value == "0" then
    return true
  end
  local minus, digits = string.match(value, "^(%-?)([1-9]%d*)$")
  if not digits or #digits > 19 then
    return false
  end
  if #digits < 19 then
    return true
  end
  -- 19 digits: compared as text, which orders digit strings of one length as numbers.
  if minus == "-" then
    return digits <= "9223372036854775808"
  end
  return digits < "9223372036854775807"
end

local record = redis.call("HMGET", KEYS[1], "state", "resp", "ns", "na", "w", "fence")
local state, steps = record[1], record[3]
-- What the operator was shown: a claim made since (a new fence), or a record that completed or
-- was released since, is not the run they chose to cancel.
if ARGV[2] then
  local found = record[2] and "complete" or state
  if not found then
    found = redis.call("EXISTS", KEYS[1]) == 1 and "released" or ""
  end
  local seen = ARGV[2] == "lapsed" and "in_progress" or ARGV[2]
  if found ~= seen or (record[6] or "") ~= ARGV[3] then
    return {-2, found}
  end
end
if record[2] or (state ~= "in_progress" and not steps) then
  return {0}
end
if not counter(record[6]) then
  return redis.error_reply("idemkey: record field fence is not an integer Redis can add 1 to: "
    .. "nothing cancelled, the record is unchanged")
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
