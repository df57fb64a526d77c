-- coord-bench's floor for coord's lock, acquire: the Redis commands the
-- unwatched partition's script (backend/unwatched.lua) issues for a lock's
-- `put` if absent while nobody waits, in the same order and with values of
-- the same sizes, and none of its logic (no decoding, no condition, no
-- revision arithmetic). What it costs is what the layout (the partition as
-- one string) pays in commands alone; the script's cost above it is the
-- script's own work.
-- KEYS[1] the partition; ARGV[1] the partition with its holder (92 bytes),
-- ARGV[2] without (18 bytes). Answers 1 when the holder was absent.
redis.call('TIME')
local before = redis.call('GET', KEYS[1])
redis.call('PSETEX', KEYS[1], '630000', ARGV[1])
if before == ARGV[1] then return 0 end
return 1
