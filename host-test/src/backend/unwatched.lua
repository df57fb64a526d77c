-- coord's store contract (wit/store.wit) for one *unwatched* partition (a
-- name beginning with '~': a lock's or a lease's), atomically. An unwatched
-- partition keeps no change feed, so it needs none of redis.lua's feed
-- stream and expiry index: the whole partition is one string, read with one
-- GET and written with one SET that also arms its TTL. callgrind counted a
-- lock pair at about a third of redis.lua's (BENCHMARKS.md, "Instruction
-- counts"). Meant for partitions of a few small entries: every call reads
-- and rewrites the whole string.
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
--   local RETENTION = <ms the partition outlives its last entry>
--
-- ARGV[1] operation, ARGV[2] '' (use Redis's TIME) or a test clock's now in
-- ms, ARGV[3..] the operation's arguments, as redis.lua takes them:
--   get     key
--   put     key, value, ttl-ms or -1, condition
--   touch   key, ttl-ms, condition
--   delete  key, condition
--   list    prefix
--   check   (none): sets waited; {now, rev, next expiry or -1}
--   arm     after: sets waited and, if rev > after and no wake-up since
--           after is in the wake stream, adds one (a blocked XREAD from
--           after then returns at once); answers 1
-- Replies are redis.lua's, so the backend reads both alike.
--
-- Revisions are seeded from the clock in microseconds, as in redis.lua.

local K, op = KEYS[1], ARGV[1]
local now, clock_us
if ARGV[2] == '' then
  local t = redis.call('TIME')
  -- Two conversions from text, not one per use: each is a strtod.
  clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local us = clock_us % 1000
  now = (clock_us - us) / 1000
else
  now = tonumber(ARGV[2]) -- a test's manual clock
  clock_us = now * 1000
end

local blob = redis.call('GET', K)
local waited, rev, woken = 0, 0, 0
local single = op == 'get' or op == 'put' or op == 'delete' or op == 'touch'
local key = single and ARGV[3] or nil
-- The key's live entry, and the other live entries as they are stored.
local value, erev, eupd, eexp
local others = ''
-- The latest expiry of the other entries (-1: one never expires).
local latest = 0
local changed = false -- the revision moved (a write or an expiry)
local listing = op == 'list'
local parts, prefix = nil, nil
if listing then parts, prefix = {}, ARGV[3] end
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
    else
      local k = string.sub(blob, at, at + kl - 1)
      if k == key then
        value, erev, eupd, eexp = string.sub(blob, at + kl, stop - 1), r, u, x
      else
        others = others .. string.sub(blob, pos, stop - 1)
        if x < 0 then latest = -1 elseif latest >= 0 and x > latest then latest = x end
        if listing and string.sub(k, 1, #prefix) == prefix then
          local stored = struct.pack('<ddd', r, u, x) .. string.sub(blob, at + kl, stop - 1)
          parts[#parts + 1] = struct.pack('<I4I4', kl + 1, #stored) .. '=' .. k .. stored
        end
      end
    end
    pos = stop
  end
end

local reply
local write = changed -- whether the partition is written back
if op == 'get' then
  if erev == nil then
    reply = {now, 0}
  else
    reply = {now, 1, key, value, erev, eupd, eexp}
  end
elseif single then
  local new_value, ttl_text, c = nil, nil, 4
  if op == 'put' then
    new_value, ttl_text, c = ARGV[4], ARGV[5], 6
  elseif op == 'touch' then
    ttl_text, c = ARGV[4], 5
  end
  local ctype = ARGV[c]
  local holds
  if ctype == 'always' then
    holds = op == 'put' or erev ~= nil
  elseif ctype == 'absent' then
    holds = op == 'put' and erev == nil
  elseif erev == nil then
    holds = false
  elseif ctype == 'revision' then
    holds = erev == tonumber(ARGV[c + 1])
  else
    holds = erev == tonumber(ARGV[c + 1]) and value == ARGV[c + 2]
  end
  if not holds then
    if erev == nil then
      reply = {now, 0, 0}
    else
      reply = {now, 0, 1, key, value, erev, eupd, eexp}
    end
  elseif op == 'delete' then
    rev = rev + 1
    if rev < clock_us then rev = clock_us end
    changed, write = true, true
    if ctype == 'revision-and-value' then
      reply = struct.pack('<Bdddd', 0, now, erev, eupd, eexp)
    else
      reply = struct.pack('<Bdddd', 1, now, erev, eupd, eexp) .. value
    end
    erev = nil
  else
    if op == 'put' then
      value = new_value
      rev = rev + 1
      if rev < clock_us then rev = clock_us end
      erev, eupd, changed = rev, now, true
    end
    local ttl = tonumber(ttl_text)
    eexp = -1
    if ttl >= 0 then eexp = now + ttl end
    write = true
    if op == 'put' or ctype == 'revision-and-value' then
      reply = struct.pack('<Bdddd', 0, now, erev, eupd, eexp)
    else
      reply = struct.pack('<Bdddd', 1, now, erev, eupd, eexp) .. value
    end
  end
elseif listing then
  -- redis.lua's listing: struct.pack('<dd', now, rev), then per entry its
  -- field ('=' .. key) and stored value (header, then value) with their
  -- lengths. Unsorted: the client sorts.
  reply = struct.pack('<dd', now, rev) .. table.concat(parts)
elseif op == 'check' or op == 'arm' then
  if waited == 0 then waited, write = 1, true end
  if op == 'arm' then
    local after = tonumber(ARGV[3])
    if rev > after and woken <= after then
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
    if eexp ~= nil then next_expiry = eexp end
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
    redis.call('XADD', base .. 'n', 'MAXLEN', '1', id .. '-0', 'r', '')
    redis.call('PEXPIRE', base .. 'n', RETENTION)
    redis.call('PUBLISH', base .. 'w', id)
    waited, woken = 0, rev
  end
  local state
  if erev == nil then
    state = struct.pack('<BBdd', 3, waited, rev, woken) .. others
  elseif others == '' then
    -- A lock's or a lease's one entry: the header and it in one pack.
    state = struct.pack('<BBdddddI4I4', 3, waited, rev, woken, erev, eupd, eexp, #key, #value) .. key .. value
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
    redis.call('SET', K, state, 'PX', string.format('%d', latest - now + RETENTION))
  end
end
return reply
