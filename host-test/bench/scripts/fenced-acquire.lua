-- coord-bench's fenced reference lock, acquire: the least a fenced Lua lock
-- needs (the holder, its expiry and a fence seeded from the clock, in one
-- hash). KEYS[1] the lock's hash, ARGV[1] the owner, ARGV[2] the TTL in ms.
-- Answers the new fence, or 0 while another owner's TTL runs.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'owner', 'expires', 'fence')
if h[1] and tonumber(h[2]) > now then return 0 end
local fence = math.max((tonumber(h[3]) or 0) + 1, now * 1000)
redis.call('HSET', KEYS[1], 'owner', ARGV[1],
  'expires', string.format('%d', now + tonumber(ARGV[2])), 'fence', string.format('%d', fence))
return fence
