-- coord's rate-limit meter (the store's `meter`) for one key, atomically.
-- The same arithmetic as component/src/meter.rs, which the store conformance
-- suite holds both to; every number stays an exact integer below 2^53.
--
-- KEYS[1] the meter's state (see MeterState): struct.pack('<Bdddd', 1, a, b, c,
--         expires-at), packed rather than text for the reason redis.lua gives;
--         the text "<a>:<b>:<c>:<expires-at>" of earlier versions is still read.
-- ARGV[1] '' (use Redis's TIME) or a test clock's now; ARGV[2] algorithm;
-- ARGV[3] limit; ARGV[4] window-ms; ARGV[5] cost; ARGV[6] mode.
-- Reply: {allowed 0/1, remaining, reset-in-ms, retry-after-ms, now}

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local algorithm, l, w, n, mode = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]

-- Exact integer division and ceiling division for non-negative integers.
local function idiv(x, y)
  local q = math.floor(x / y)
  if q * y > x then q = q - 1 elseif (q + 1) * y <= x then q = q + 1 end
  return q
end
local function cdiv(x, y)
  local q = idiv(x, y)
  if q * y < x then q = q + 1 end
  return q
end
local function int(x)
  return string.format('%d', x)
end

local state = nil
if mode ~= 'reset' then
  local raw = redis.call('GET', KEYS[1])
  if raw then
    local a, b, c, e
    if #raw == 33 and string.byte(raw) == 1 then
      local _
      _, a, b, c, e = struct.unpack('<Bdddd', raw)
    else
      a, b, c, e = string.match(raw, '^(%d+):(%d+):(%d+):(%d+)$')
      if a then a, b, c, e = tonumber(a), tonumber(b), tonumber(c), tonumber(e) end
    end
    if a and e > now then
      state = {a, b, c}
    end
  end
end

-- Each returns allowed, remaining after, reset-in, retry-after, the counted
-- state {a, b, c}, its ttl, and the remaining before counting.
local function sliding()
  local window_start = now - (now - idiv(now, w) * w)
  local start, curr, prev = window_start, 0, 0
  if state then start, curr, prev = state[1], state[2], state[3] end
  if start ~= window_start then
    if window_start == start + w then prev = curr else prev = 0 end
    curr = 0
    start = window_start
  end
  local estimate = prev * (w - (now - start)) + curr * w
  local allowed = estimate + n * w <= l * w
  local before = idiv(math.max(l * w - estimate, 0), w)
  local after = before
  if allowed then after = idiv(l * w - estimate - n * w, w) end
  local reset_in = start + w - now
  local retry = 0
  if not allowed then
    local room = l - n - curr
    local t = nil
    if room >= 0 and prev > 0 then t = start + w - idiv(room * w, prev) end
    if t ~= nil and t < start + w then
      retry = math.max(t - now, 0)
    else
      local d = 0
      if curr > 0 then d = math.max(w - idiv((l - n) * w, curr), 0) end
      retry = start + w + d - now
    end
  end
  return allowed, after, reset_in, retry, {start, curr + n, prev}, start + 2 * w - now, before
end

local function fixed()
  local start = now - (now - idiv(now, w) * w)
  local count = 0
  if state and state[1] == start then count = state[2] end
  local allowed = count + n <= l
  local before = math.max(l - count, 0)
  local after = before
  if allowed then after = l - count - n end
  local reset_in = start + w - now
  local retry = 0
  if not allowed then retry = reset_in end
  return allowed, after, reset_in, retry, {start, count + n, 0}, reset_in, before
end

local function gcra()
  local tat, frac = 0, 0
  if state then tat, frac = state[1], state[2] end
  if tat < now then tat, frac = now, 0 end
  local used = (tat - now) * l + frac
  local increment = n * w
  local next_tat = tat + idiv(increment, l)
  local next_frac = frac + (increment - idiv(increment, l) * l)
  if next_frac >= l then
    next_tat = next_tat + 1
    next_frac = next_frac - l
  end
  local used_after = (next_tat - now) * l + next_frac
  local capacity = w * l
  local allowed = used_after <= capacity
  local before = idiv(math.max(capacity - used, 0), w)
  local after, occupied = before, used
  if allowed then after, occupied = idiv(capacity - used_after, w), used_after end
  local retry = 0
  if not allowed then retry = cdiv(used_after - capacity, l) end
  return allowed, after, cdiv(occupied, l), retry, {next_tat, next_frac, 0}, cdiv(used_after, l), before
end

local allowed, after, reset_in, retry, counted, ttl, before
if algorithm == 'sliding-window' then
  allowed, after, reset_in, retry, counted, ttl, before = sliding()
elseif algorithm == 'fixed-window' then
  allowed, after, reset_in, retry, counted, ttl, before = fixed()
elseif algorithm == 'gcra' then
  allowed, after, reset_in, retry, counted, ttl, before = gcra()
else
  return redis.error_reply('coord: unknown meter algorithm ' .. tostring(algorithm))
end

if mode == 'reset' then
  redis.call('DEL', KEYS[1])
elseif mode == 'consume' and allowed then
  ttl = math.max(ttl, 1)
  local encoded = struct.pack('<Bdddd', 1, counted[1], counted[2], counted[3], now + ttl)
  redis.call('SET', KEYS[1], encoded, 'PX', int(ttl))
end
if mode ~= 'consume' and allowed then after = before end
local a = 0
if allowed then a = 1 end
-- One packed string, cheaper for Redis to send than an array: allowed,
-- remaining, reset-in, retry-after, now. Floored as Redis floors a Lua
-- number it turns into an integer reply (every one here is at least 0).
local f = math.floor
return struct.pack('<Bdddd', a, f(after), f(reset_in), f(retry), f(now))
