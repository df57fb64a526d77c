-- coord-bench's fenced reference lock, release. KEYS[1] the lock's hash,
-- ARGV[1] the owner. Answers 1 when that owner held it, else 0; the fence
-- stays for the next holder.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'owner', 'expires')
  return 1
end
return 0
