-- checkpoint: store the result of one finished step of a claimed call (a recovery point).
--
-- KEYS[1]  record hash   {prefix}:{<digest>}
-- KEYS[2]  lock string   {prefix}:{<digest>}:lock  (not written: named so every script of a
--                        record sends the same two keys, in one slot)
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
--        nothing was written.
--
-- Invariants: reads and checks first, writes last. The owner field, not the lock, decides,
-- as in complete: a lease that lapsed without a takeover still lets its owner checkpoint.
-- Running it twice with the same owner writes once; the second answer names the stored result.

local record = redis.call("HMGET", KEYS[1], "owner", "state", ARGV[2])
if record[1] ~= ARGV[1] or record[2] ~= "in_progress" then
  return 0
end
if record[3] then
  return record[3]
end
redis.call("HSET", KEYS[1], ARGV[2], ARGV[3])
redis.call("HINCRBY", KEYS[1], "ns", 1)
return 1
