-- coord-bench's plain sliding-window check: what a user would write instead
-- of coord's meter, in the manner of Upstash's sliding window: two fixed
-- windows' counters, the previous one weighted by how much of it the
-- sliding window still covers. The caller names the two windows' keys from
-- its own clock and passes that clock (no TIME: unlike coord, whose time is
-- the store's, hosts whose clocks disagree disagree on the window).
-- KEYS[1] the current window's counter, KEYS[2] the previous window's;
-- ARGV[1] limit, ARGV[2] the caller's now in ms, ARGV[3] the window in ms,
-- ARGV[4] the cost. Answers the units left after counting, or -1 when the
-- cost does not fit (and nothing is counted).
local limit, now, window, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local previous = tonumber(redis.call('GET', KEYS[2]) or '0')
local estimate = math.floor(previous * (1 - (now % window) / window)) + current
if estimate + cost > limit then return -1 end
if redis.call('INCRBY', KEYS[1], cost) == cost then
  -- A new window: its counter lives while it can still be the previous one.
  redis.call('PEXPIRE', KEYS[1], window * 2)
end
return limit - estimate - cost
