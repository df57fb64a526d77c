-- coord-bench's floor for coord's lock, release: the Redis commands the
-- unwatched partition's script issues for a lock's guarded `delete` while
-- nobody waits, in order, with none of its logic (see commands-acquire.lua).
-- Same key and arguments. Answers 1 when the holder was there.
redis.call('TIME')
local before = redis.call('GET', KEYS[1])
redis.call('PSETEX', KEYS[1], '600000', ARGV[2])
if before == ARGV[1] then return 1 end
return 0
