-- coord's rate-limit meter (the store's `meter`) for one key, atomically.
-- The same arithmetic as component/src/meter.rs, which the store conformance
-- suite holds both to; every number stays an exact integer below 2^53.
--
-- KEYS[1] the meter's state (see MeterState): struct.pack('<Bdddd', 1, a, b, c,
--         expires-at), packed rather than text for the reason redis.lua gives;
--         the text "<a>:<b>:<c>:<expires-at>" of earlier versions is still read.
-- ARGV[1] every input in one string, struct.pack('<BBddddd', algorithm, mode,
--         clock, limit, window-ms, cost, at): algorithm 1 sliding window, 2
--         fixed window, 3 GCRA; mode 1 consume, 2 peek, 3 reset, 4 charge
--         (consume, counting what does not fit too), 5 refund (give back
--         `cost` units counted at store time `at`); clock -1 for
--         Redis's TIME, -d (d > 1) for Redis's TIME and a deadline d past
--         which the call changes nothing and answers the error LATE (as in
--         unwatched.lua), else a test clock's now. One packed argument, because
--         each argument costs Redis a string and a slot in ARGV, and a number
--         in text a strtod besides, more than the rest of its reading.
-- Reply: {allowed 0/1, remaining, reset-in-ms, retry-after-ms, now}

local SLIDING_WINDOW, FIXED_WINDOW, GCRA = 1, 2, 3
local CONSUME, PEEK, RESET, CHARGE, REFUND = 1, 2, 3, 4, 5
local algorithm, mode, now, l, w, n, at = struct.unpack('<BBddddd', ARGV[1])
if now < 0 then
  local deadline = -now
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if deadline > 1 and now > deadline then
    return redis.error_reply('LATE the call ran past its deadline; nothing was applied')
  end
end

-- Exact integer division and ceiling division for non-negative integers.
-- Neither refers to a local of the script, so creating them on each call
-- costs no upvalues; the algorithms below are plain branches, not closures,
-- for the same reason (a closure over the script's locals costs Redis more
-- than the arithmetic it holds).
local function idiv(x, y)
  local q = math.floor(x / y)
  if q * y > x then q = q - 1 elseif (q + 1) * y <= x then q = q + 1 end
  return q
end
local function cdiv(x, y)
  local q = math.floor(x / y)
  if q * y > x then q = q - 1 elseif (q + 1) * y <= x then q = q + 1 end
  if q * y < x then q = q + 1 end
  return q
end

if algorithm ~= SLIDING_WINDOW and algorithm ~= FIXED_WINDOW and algorithm ~= GCRA then
  return redis.error_reply('coord: unknown meter algorithm ' .. tostring(algorithm))
end
if mode < CONSUME or mode > REFUND then
  return redis.error_reply('coord: unknown meter mode ' .. tostring(mode))
end

-- The stored state {s1, s2, s3}, when there is one that has not expired.
local stored, s1, s2, s3 = false, 0, 0, 0
if mode ~= RESET then
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
      stored, s1, s2, s3 = true, a, b, c
    end
  end
end

-- A refund gives back n units counted at `at`, where the state still counts
-- them (component/src/meter.rs, `refund`), then answers as a peek.
local refunded, refund_ttl = false, 0
if mode == REFUND and stored then
  local start = now - (now - idiv(now, w) * w)
  local at_start = at - (at - idiv(at, w) * w)
  if algorithm == FIXED_WINDOW then
    if s1 == start and at_start == start then
      s2 = math.max(s2 - n, 0)
      refunded, refund_ttl = true, start + w - now
    end
  elseif algorithm == SLIDING_WINDOW then
    local curr, prev = 0, 0
    if s1 == start then curr, prev = s2, s3 elseif start == s1 + w then prev = s2 end
    if at_start == start then
      curr = math.max(curr - n, 0)
    elseif at_start + w == start then
      prev = math.max(prev - n, 0)
    end
    s1, s2, s3 = start, curr, prev
    refunded, refund_ttl = true, start + 2 * w - now
  elseif s1 >= now then -- gcra
    local used = math.max((s1 - now) * l + s2 - n * w, 0)
    s1, s2, s3 = now + idiv(used, l), used - idiv(used, l) * l, 0
    refunded, refund_ttl = true, cdiv(used, l)
  end
end

-- Each algorithm sets: allowed, remaining after and before counting,
-- reset-in, retry-after, the counted state {c1, c2, c3} and its ttl.
local allowed, after, before, reset_in, retry, c1, c2, c3, ttl
if algorithm == SLIDING_WINDOW then
  local window_start = now - (now - idiv(now, w) * w)
  local start, curr, prev = window_start, 0, 0
  if stored then start, curr, prev = s1, s2, s3 end
  if start ~= window_start then
    if window_start == start + w then prev = curr else prev = 0 end
    curr = 0
    start = window_start
  end
  local estimate = prev * (w - (now - start)) + curr * w
  allowed = estimate + n * w <= l * w
  before = idiv(math.max(l * w - estimate, 0), w)
  after = before
  if allowed then after = idiv(l * w - estimate - n * w, w) end
  reset_in = start + w - now
  retry = 0
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
  c1, c2, c3, ttl = start, curr + n, prev, start + 2 * w - now
elseif algorithm == FIXED_WINDOW then
  local start = now - (now - idiv(now, w) * w)
  local count = 0
  if stored and s1 == start then count = s2 end
  allowed = count + n <= l
  before = math.max(l - count, 0)
  after = before
  if allowed then after = l - count - n end
  reset_in = start + w - now
  retry = 0
  if not allowed then retry = reset_in end
  c1, c2, c3, ttl = start, count + n, 0, reset_in
else -- gcra
  local tat, frac = 0, 0
  if stored then tat, frac = s1, s2 end
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
  allowed = used_after <= capacity
  before = idiv(math.max(capacity - used, 0), w)
  after = before
  local occupied = used
  if allowed then after, occupied = idiv(capacity - used_after, w), used_after end
  reset_in = cdiv(occupied, l)
  retry = 0
  if not allowed then retry = cdiv(used_after - capacity, l) end
  c1, c2, c3, ttl = next_tat, next_frac, 0, cdiv(used_after, l)
end

local forced = mode == CHARGE and not allowed
if forced then
  -- Counted past the limit: nothing remains; GCRA is full again once the
  -- charged state has gone.
  allowed, after, retry = true, 0, 0
  if algorithm == GCRA then reset_in = ttl end
end
if refunded then
  c1, c2, c3, ttl = s1, s2, s3, refund_ttl
end
if mode == RESET then
  redis.call('DEL', KEYS[1])
elseif ((mode == CONSUME or mode == CHARGE) and allowed) or refunded then
  ttl = math.max(ttl, 1)
  local encoded = struct.pack('<Bdddd', 1, c1, c2, c3, now + ttl)
  -- PSETEX rather than SET ... PX: fewer arguments, no options to parse.
  redis.call('PSETEX', KEYS[1], string.format('%d', ttl), encoded)
end
if mode ~= CONSUME and mode ~= CHARGE and allowed then after = before end
local a = 0
if allowed then a = 1 end
-- One packed string, cheaper for Redis to send than an array: allowed,
-- remaining, reset-in, retry-after, now. Every number is an exact integer
-- here (whole inputs, and only the divisions above).
return struct.pack('<Bdddd', a, after, reset_in, retry, now)
