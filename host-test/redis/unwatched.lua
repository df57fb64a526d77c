-- coord's store contract (wit/store.wit) for one *unwatched* partition (a
-- name beginning with '~': a lock's or a lease's), atomically. An unwatched
-- partition keeps no change feed, so it needs none of redis.lua's feed
-- stream and expiry index: the whole partition is one string, read with one
-- GET and written with one PSETEX, which also arms its TTL. callgrind counts
-- every call (BENCHMARKS.md, "Instruction counts"). Meant for partitions of
-- a few small entries: every call reads and rewrites the whole string.
--
-- KEYS[1] the partition: struct.pack('<BBdd', 3, waited, rev, woken), then per
--   live entry struct.pack('<dddI4I4', revision, updated-at, expires-at or -1,
--   #key, #value) .. key .. value. 3 is the layout's version; waited is 1
--   while somebody may be waiting on the partition; rev is its latest
--   revision; woken the revision of the last wake-up in the wake stream.
-- Beside it, sharing its hash tag (the key with its last letter replaced):
--   ...n  the wake stream a blocked wait-then-put reads, one message with id
--         "<revision>-0" per wake-up, and
--   ...w  the channel `wait` subscribes to.
--
-- Waking costs three commands (XADD, PEXPIRE, PUBLISH), so a write wakes
-- only when `waited` says somebody may wait: every waiter sets it (`check`,
-- `arm`) after subscribing and before it sleeps, and the first write that
-- changes the revision after that wakes it and clears it. A waiter that
-- goes back to sleep checks, and sets it, again.
--
-- The backend loads this script behind the line
--   local RETENTION, PUBLISH, STREAM = <ms the partition outlives its last
--     entry>, '<PUBLISH, or SPUBLISH on a cluster>', <whether to keep the
--     wake stream: true on one server, false on a cluster>
-- On a cluster the wake stream is not kept: a script may only touch the
-- keys it declares there (a key it does not declare can be on another node
-- while its slot migrates), and declaring a key that is usually absent would
-- make every call to the partition TRYAGAIN while its slot migrates. Lock
-- waiters on a cluster wait on the channel instead.
--
-- ARGV[1] every input in one string (one argument: Redis makes a string and
-- an ARGV slot of each, and numbers in text cost a strtod besides):
--   struct.pack('<BBddd', op, condition, clock, number, guard revision)
--   .. struct.pack('<I4', #key) .. key .. struct.pack('<I4', #value) .. value
--   .. struct.pack('<I4', #guard value) .. guard value
-- op       1 get, 2 put, 3 touch, 4 delete, 5 list (key: the prefix),
--          6 check: sets waited; {now, rev, next expiry or -1},
--          7 arm (number: after): sets waited and, if rev > after and no
--            wake-up since after is in the wake stream, adds one (a blocked
--            XREAD from after then returns at once); answers 1
-- condition  a write's: 1 always, 2 absent, 3 revision (the guard
--          revision), 4 revision and value (the guard revision and value),
--          5 absent and fewer than (the guard revision: the limit)
-- clock    -1 for Redis's TIME; -d (d > 1) for Redis's TIME and a deadline d
--          in ms on it, past which the call changes nothing and answers the
--          error LATE (its caller has answered `unavailable` by then: a
--          call held in a paused server must not apply afterwards); else a
--          test clock's now in ms
-- number   put and touch: the TTL in ms, -1 for none; arm: after
-- Replies are redis.lua's, so the backend reads both alike.
--
-- Revisions are seeded from the clock in microseconds, as in redis.lua.

local GET, PUT, TOUCH, DELETE, LIST, CHECK, ARM = 1, 2, 3, 4, 5, 6, 7
local ALWAYS, ABSENT, REVISION, FEWER = 1, 2, 3, 5

local K = KEYS[1]
local op, ctype, now, number, guard, key, new_value, guard_value =
  struct.unpack('<BBdddI4c0I4c0I4c0', ARGV[1])
local clock_us
if now < 0 then
  local deadline = -now
  local t = redis.call('TIME')
  -- Two conversions from text, not one per use: each is a strtod.
  clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local us = clock_us % 1000
  now = (clock_us - us) / 1000
  if deadline > 1 and now > deadline then
    return redis.error_reply('LATE the call ran past its deadline; nothing was applied')
  end
else
  clock_us = now * 1000 -- a test's manual clock
end

local blob = redis.call('GET', K)
local waited, rev, woken = 0, 0, 0
-- The key's live entry, and the other live entries as they are stored.
local value, erev, eupd, eexp
local others = ''
-- The latest expiry of the other entries (-1: one never expires).
local latest = 0
local changed = false -- the revision moved (a write or an expiry)
local listing = op == LIST
local parts
if listing then parts = {} end
-- How many entries are live, and where the other live entry that expires
-- first is stored (for absent-and-fewer-than's conflict).
local live, first_at, first_x = 0, nil, nil
-- The start in `blob` of the current run of other entries, copied into
-- `others` a run at a time: one concatenation per skipped entry, not one
-- per entry (quadratic in a semaphore's permits).
local run = nil
if blob then
  if #blob < 18 or string.byte(blob) ~= 3 then
    -- Not this layout: refuse rather than misread (or overwrite) it.
    return redis.error_reply('coord: partition ' .. K .. ' is in another layout')
  end
  local _, pos
  _, waited, rev, woken, pos = struct.unpack('<BBdd', blob)
  local size = #blob
  while pos <= size do
    local r, u, x, kl, vl, at = struct.unpack('<dddI4I4', blob, pos)
    local stop = at + kl + vl
    if x >= 0 and x <= now then
      -- Expired: recorded by a revision of its own.
      rev = rev + 1
      if rev < clock_us then rev = clock_us end
      changed = true
      if run then others, run = others .. string.sub(blob, run, pos - 1), nil end
    else
      live = live + 1
      local k = string.sub(blob, at, at + kl - 1)
      if k == key and op <= DELETE then
        value, erev, eupd, eexp = string.sub(blob, at + kl, stop - 1), r, u, x
        if run then others, run = others .. string.sub(blob, run, pos - 1), nil end
      else
        if not run then run = pos end
        if first_at == nil or (x >= 0 and (first_x < 0 or x < first_x)) then
          first_at, first_x = pos, x
        end
        if x < 0 then latest = -1 elseif latest >= 0 and x > latest then latest = x end
        if listing and string.sub(k, 1, #key) == key then
          local stored = struct.pack('<ddd', r, u, x) .. string.sub(blob, at + kl, stop - 1)
          parts[#parts + 1] = struct.pack('<I4I4', kl + 1, #stored) .. '=' .. k .. stored
        end
      end
    end
    pos = stop
  end
  if run then others = others .. string.sub(blob, run, size) end
end

local reply
local write = changed -- whether the partition is written back
if op == GET then
  if erev == nil then
    reply = {now, 0}
  else
    reply = {now, 1, key, value, erev, eupd, eexp}
  end
elseif op <= DELETE then
  local holds
  if ctype == ALWAYS then
    holds = op == PUT or erev ~= nil
  elseif ctype == ABSENT then
    holds = op == PUT and erev == nil
  elseif ctype == FEWER then
    -- The guard revision carries the limit.
    holds = op == PUT and erev == nil and live < guard
  elseif erev == nil then
    holds = false
  elseif ctype == REVISION then
    holds = erev == guard
  else
    holds = erev == guard and value == guard_value
  end
  -- Whether the reply leaves the value out: the caller sent it (a put's
  -- own, or a guard's).
  local sent = op == PUT or ctype > REVISION
  if not holds then
    if erev == nil and ctype == FEWER and op == PUT and first_at then
      -- Full: the live entry that expires first.
      local r, u, x, kl, vl, at = struct.unpack('<dddI4I4', blob, first_at)
      reply = {now, 0, rev, 1, string.sub(blob, at, at + kl - 1),
        string.sub(blob, at + kl, at + kl + vl - 1), r, u, x}
    elseif erev == nil then
      reply = {now, 0, rev, 0}
    else
      reply = {now, 0, rev, 1, key, value, erev, eupd, eexp}
    end
  elseif op == DELETE then
    rev = rev + 1
    if rev < clock_us then rev = clock_us end
    changed, write = true, true
    if sent then
      reply = struct.pack('<Bddddd', 0, now, rev, erev, eupd, eexp)
    else
      reply = struct.pack('<Bddddd', 1, now, rev, erev, eupd, eexp) .. value
    end
    erev = nil
  else
    if op == PUT then
      value = new_value
      rev = rev + 1
      if rev < clock_us then rev = clock_us end
      erev, eupd, changed = rev, now, true
    end
    eexp = -1
    if number >= 0 then eexp = now + number end
    write = true
    if sent then
      reply = struct.pack('<Bddddd', 0, now, rev, erev, eupd, eexp)
    else
      reply = struct.pack('<Bddddd', 1, now, rev, erev, eupd, eexp) .. value
    end
  end
elseif listing then
  -- redis.lua's listing: struct.pack('<dd', now, rev), then per entry its
  -- field ('=' .. key) and stored value (header, then value) with their
  -- lengths. Unsorted: the client sorts.
  reply = struct.pack('<dd', now, rev) .. table.concat(parts)
elseif op == CHECK or op == ARM then
  if waited == 0 then waited, write = 1, true end
  if op == ARM then
    if STREAM and rev > number and woken <= number then
      -- A change since `after` that woke nobody: leave its wake-up now.
      local stream = string.sub(K, 1, -2) .. 'n'
      redis.call('XADD', stream, 'MAXLEN', '1', string.format('%d', rev) .. '-0', 'r', '')
      redis.call('PEXPIRE', stream, RETENTION)
      woken, write = rev, true
    end
    reply = 1
  else
    -- Every entry left is live, so the next expiry is the earliest of them.
    local next_expiry = -1
    local pos, size = 1, #others
    while pos <= size do
      local _, _, x, kl, vl, at = struct.unpack('<dddI4I4', others, pos)
      if x >= 0 and (next_expiry < 0 or x < next_expiry) then next_expiry = x end
      pos = at + kl + vl
    end
    reply = {now, rev, next_expiry}
  end
else
  return redis.error_reply('coord: operation ' .. tostring(op) .. ' is not kept for an unwatched partition')
end

if write then
  if changed and waited == 1 then
    -- Somebody may be waiting: wake them, through the stream a blocked
    -- wait-then-put reads and the channel `wait` listens to.
    local base = string.sub(K, 1, -2)
    local id = string.format('%d', rev)
    if STREAM then
      redis.call('XADD', base .. 'n', 'MAXLEN', '1', id .. '-0', 'r', '')
      redis.call('PEXPIRE', base .. 'n', RETENTION)
    end
    redis.call(PUBLISH, base .. 'w', id)
    waited, woken = 0, rev
  end
  local state
  if erev == nil then
    state = struct.pack('<BBdd', 3, waited, rev, woken) .. others
  elseif others == '' then
    -- A lock's or a lease's one entry: the header and it in one pack.
    state = struct.pack('<BBdddddI4I4c0c0', 3, waited, rev, woken, erev, eupd, eexp, #key, #value, key, value)
  else
    state = struct.pack('<BBdd', 3, waited, rev, woken) .. others
      .. struct.pack('<dddI4I4', erev, eupd, eexp, #key, #value) .. key .. value
  end
  if erev ~= nil then
    if eexp < 0 then latest = -1 elseif latest >= 0 and eexp > latest then latest = eexp end
  end
  if latest < 0 then
    -- An entry that never expires keeps the partition.
    redis.call('SET', K, state)
  else
    if latest < now then latest = now end
    -- PSETEX, not SET ... PX: one argument and no options to parse, about
    -- 750 instructions less a call (callgrind-redis.sh).
    redis.call('PSETEX', K, string.format('%d', latest - now + RETENTION), state)
  end
end
return reply
