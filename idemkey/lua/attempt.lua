-- attempt: count one more attempt of a step that retries (call.step(..., retry=StepRetry(...))).
--
-- KEYS[1]  record hash   {prefix}:{<digest>}, the only key
-- ARGV[1]  owner         the token the claim returned
-- ARGV[2]  field         "a:" .. step name (the name validated by idemkey._steps)
--
-- Record field "na" marks a record that counts attempts, so release and complete find the
-- "a:" fields without a scan when there are none (see release.lua, complete.lua, cancel.lua).
--
-- Reply: the attempt's number (1 for the first), counted across every executor since the
--        record was last claimed afresh: a takeover continues the count, a release drops it;
--        0 lost: the record is not ours in progress (taken over, released, complete, cancelled)
--        and nothing was written;
--        error "idemkey: record field a:<name> is not an integer ...": the stored count is not
--        one HINCRBY adds 1 to (stored bytes are input); nothing was written, "na" included.
--
-- Invariants: the owner and the count are checked before any write, as in checkpoint. Not
-- idempotent on a re-send (a lost reply counts one attempt more): an attempt counted and not
-- run only shortens the retries, it never runs a step twice.

-- Whether HINCRBY adds 1 to a stored field (as in cancel.lua, which says how).
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
  if minus == "-" then
    return digits <= "9223372036854775808"
  end
  return digits < "9223372036854775807"
end

local record = redis.call("HMGET", KEYS[1], "owner", "state", ARGV[2])
if record[1] ~= ARGV[1] or record[2] ~= "in_progress" then
  return 0
end
if not counter(record[3]) then
  return redis.error_reply("idemkey: record field " .. ARGV[2] .. " is not an integer Redis "
    .. "can add 1 to: the attempt is not counted, the record is unchanged")
end
redis.call("HSET", KEYS[1], "na", 1)
return redis.call("HINCRBY", KEYS[1], ARGV[2], 1)
