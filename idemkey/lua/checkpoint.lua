-- checkpoint: store the result of one finished step of a claimed call (a recovery point).
--
-- KEYS[1]  record hash   {prefix}:{<digest>}, the only key
-- ARGV[1]  owner         the token the claim returned
-- ARGV[2]  field         "s:" .. step name (the name validated by idemkey._steps)
-- ARGV[3]  result        encoded step result (version byte + msgpack)
--
-- Record field "ns" counts the stored steps, so claim and complete find them without a scan
-- when there are none (the common case costs one HMGET field).
--
-- Reply: 1 stored; a string: the step was stored already (a re-sent call, or a retry of a
--        checkpoint whose reply was lost), and that is its result: the first result stays;
--        0 lost: the record is not ours in progress (taken over, released, complete) and
--        nothing was written;
--        error "idemkey: record field ns is not an integer ...": the stored count is not one
--        HINCRBY adds 1 to (stored bytes are input); nothing was written (the step is not
--        stored beside a count that does not count it).
--
-- Invariants: reads and checks first, writes last (the count is checked before the HSET). The
-- owner field, not the lease, decides, as in complete: a lease that lapsed without a takeover
-- still lets its owner checkpoint.
-- Running it twice with the same owner writes once; the second answer names the stored result.

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

local record = redis.call("HMGET", KEYS[1], "owner", "state", ARGV[2], "ns")
if record[1] ~= ARGV[1] or record[2] ~= "in_progress" then
  return 0
end
if record[3] then
  return record[3]
end
if not counter(record[4]) then
  return redis.error_reply("idemkey: record field ns is not an integer Redis can add 1 to: "
    .. "the step is not stored, the record is unchanged")
end
redis.call("HSET", KEYS[1], ARGV[2], ARGV[3])
redis.call("HINCRBY", KEYS[1], "ns", 1)
return 1
