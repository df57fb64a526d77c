-- coord-bench's floor for coord's lock, release: the Redis commands the
-- store script issues for a lock's guarded `delete`, in order, with none of
-- its logic (see commands-acquire.lua). Same keys and arguments. Answers
-- the holder fields deleted (1 after an acquire).
local t = redis.call('TIME')
redis.call('HMGET', KEYS[1], '#', '=holder')
local deleted = redis.call('HDEL', KEYS[1], '=holder')
redis.call('ZREM', KEYS[2], '=holder')
redis.call('XADD', KEYS[3], 'MAXLEN', '~', '64', '*', 'm', ARGV[3])
redis.call('HSET', KEYS[1], '#', ARGV[2])
redis.call('PUBLISH', ARGV[4], t[1])
return deleted
