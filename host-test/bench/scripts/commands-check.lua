-- coord-bench's floor for coord's rate-limit check: the Redis commands the
-- meter script (backend/meter.lua) issues for a sliding-window check that
-- consumes, with values of the same sizes, and none of its logic (no
-- decoding, no arithmetic). What it costs is what the check pays in
-- commands alone; the meter script's cost above it is the script's own
-- work. coord-bench times it beside the reference locks, and
-- callgrind-redis.sh counts it.
-- KEYS[1] the meter's state; ARGV[1] its new state (33 bytes), ARGV[2] the
-- reply (33 bytes). Answers the reply.
redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('PSETEX', KEYS[1], '60000', ARGV[1])
return ARGV[2]
