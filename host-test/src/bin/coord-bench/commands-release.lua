-- coord-bench's floor for coord's lock, release: the Redis commands the
-- unwatched partition's script issues for a lock's guarded `delete` while
-- nobody waits, in order, with none of its logic (see commands-acquire.lua).
-- Same key and arguments. Answers 1 when the holder was there.
redis.call('TIME')
local before = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[2], 'PX', '600000')
if before == ARGV[1] then return 1 end
return 0
