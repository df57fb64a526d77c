-- coord-bench's floor for coord's lock, acquire: the Redis commands the
-- store script (backend/redis.lua) issues for a lock's `put` if absent, in
-- the same order and with values of the same sizes, and none of its logic
-- (no decoding, no condition, no revision arithmetic). What it costs is
-- what coord's layout (the holder and meta in one hash, an expiry index, a
-- stream for the change feed, a channel for waiters) pays in commands
-- alone; the store script's cost above it is the script's own work.
-- KEYS[1] entries hash, KEYS[2] expiry index, KEYS[3] feed (coord's three
-- keys); ARGV[1] the entry, ARGV[2] the meta, ARGV[3] the feed message,
-- ARGV[4] the channel. Answers the new fields written: 1 when the holder
-- was absent (the caller creates the meta field beforehand).
local t = redis.call('TIME')
redis.call('HMGET', KEYS[1], '#', '=holder')
redis.call('XADD', KEYS[3], 'MAXLEN', '~', '64', '*', 'm', ARGV[3])
redis.call('ZADD', KEYS[2], t[1], '=holder')
local added = redis.call('HSET', KEYS[1], '=holder', ARGV[1], '#', ARGV[2])
redis.call('PUBLISH', ARGV[4], t[1])
return added
