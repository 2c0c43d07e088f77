-- Previous tasks (previous.py): after a publish, mark or put back previous-task keys.
--
-- ARGV[1] = JSON list of [prev key, expected value, new value ("" = delete), prev TTL ms]: set
-- each key that still holds what this manager wrote (flag 0 -> 1, or back to what it was).
for _, t in ipairs(cjson.decode(ARGV[1])) do
  if redis.call('GET', t[1]) == t[2] then
    if t[3] == '' then
      redis.call('DEL', t[1])
    else
      redis.call('SET', t[1], t[3], 'PX', t[4])
    end
  end
end
return 1
