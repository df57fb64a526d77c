-- coord's store contract (wit/store.wit) for one partition, atomically.
--
-- KEYS[1] meta    hash:   rev (latest revision), complete (the feed holds every
--                         change after it), created (the floor this incarnation
--                         of the partition started from), until (the time the
--                         keys' TTLs were last armed to, -1 while an entry
--                         without TTL keeps them), maxexp (the latest expiry
--                         ever given to an entry)
-- KEYS[2] entries hash:   key -> "<revision>:<updated-at>:<expires-at or -1>:<value>"
-- KEYS[3] expiry  zset:   key -> expires-at, for the sweep
-- KEYS[4] feed    stream: one message per change, id "<revision>-0"
-- All four share one hash tag, so the script touches one cluster slot.
--
-- ARGV[1] operation, ARGV[2] '' (use Redis's TIME) or a test clock's now in ms, ARGV[3] history
-- (changes kept), ARGV[4] retention ms (how long the partition outlives its last
-- entry), ARGV[5] the channel to publish a partition's changes on, ARGV[6..] the
-- operation's arguments.
--
-- Revisions are seeded from the clock (at least now-ms * 1000), so a revision
-- issued after Redis lost its data still exceeds every revision before it.

local M, E, X, F = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2]) -- a test's manual clock
end
local history = tonumber(ARGV[3])
local retention = tonumber(ARGV[4])
local channel = ARGV[5]

local function int(n)
  return string.format('%.0f', n)
end

local meta = redis.call('HMGET', M, 'rev', 'complete', 'created', 'until', 'maxexp')
local rev = tonumber(meta[1] or '0')
local complete = tonumber(meta[2] or '0')
local created = tonumber(meta[3] or '0')
local armed_until = tonumber(meta[4] or '0')
local maxexp = tonumber(meta[5] or '0')
local dirty = false
-- Whether the keys' TTLs must be (re)armed in this call: always for a new
-- incarnation, and when Redis may have just created a key anew.
local arm = rev == 0
local ttl_less = false

local function next_revision()
  local floor = now * 1000
  if rev == 0 then
    -- A new incarnation: its feed is complete from here on, and nothing
    -- before it can be read from it.
    created = floor - 1
    complete = created
  end
  rev = math.max(rev + 1, floor)
  return rev
end

local function record(kind, key, value, at)
  local r = next_revision()
  local excess = redis.call('XLEN', F) - history + 1
  if excess > 0 then
    local trimmed = redis.call('XRANGE', F, '-', '+', 'COUNT', excess)
    local last = trimmed[#trimmed][1]
    complete = tonumber(string.match(last, '^(%d+)'))
  end
  redis.call('XADD', F, 'MAXLEN', history, int(r) .. '-0', 'k', kind, 'key', key, 'v', value, 'at', int(at))
  dirty = true
  return r
end

local function decode(key, packed)
  local r, u, x, rest = string.match(packed, '^(%d+):(%d+):(-?%d+):()')
  return {key, string.sub(packed, rest), tonumber(r), tonumber(u), tonumber(x)}
end

local function current(key)
  local packed = redis.call('HGET', E, key)
  if not packed then
    return nil
  end
  return decode(key, packed)
end

local function store(e)
  redis.call('HSET', E, e[1], int(e[3]) .. ':' .. int(e[4]) .. ':' .. int(e[5]) .. ':' .. e[2])
  if e[5] >= 0 then
    redis.call('ZADD', X, int(e[5]), e[1])
    maxexp = math.max(maxexp, e[5])
  else
    redis.call('ZREM', X, e[1])
    ttl_less = true
  end
  -- An emptied hash is deleted by Redis; one entry now means it was just
  -- created again, without a TTL.
  if redis.call('HLEN', E) == 1 then arm = true end
  dirty = true
end

-- Record the expiry of every entry whose TTL has run out, in expiry order.
local due = redis.call('ZRANGEBYSCORE', X, '-inf', int(now), 'WITHSCORES')
for i = 1, #due, 2 do
  redis.call('HDEL', E, due[i])
  redis.call('ZREM', X, due[i])
  record('expire', due[i], '', tonumber(due[i + 1]))
end

local function holds(e, ctype, crev, cval)
  if ctype == 'always' then return true end
  if ctype == 'absent' then return e == nil end
  if e == nil then return false end
  if ctype == 'revision' then return e[3] == crev end
  return e[3] == crev and e[2] == cval
end

-- Persist the partition's state, keep its keys alive as long as an entry or
-- the retention needs them, and wake the partition's waiters.
local function finish(reply)
  if dirty then
    -- Keep the keys until the latest expiry plus the retention. Re-arming
    -- costs four commands, so it is done only when the keys' TTLs would
    -- otherwise fall short by more than half the retention (they still
    -- outlive every entry by at least half of it), or a key is new.
    local forever = ttl_less
    if armed_until == -1 and not forever then
      forever = redis.call('HLEN', E) > redis.call('ZCARD', X)
      arm = arm or not forever
    end
    local command = nil
    if forever then
      if armed_until ~= -1 then command, armed_until = 'PERSIST', -1 end
    else
      local keep_until = math.max(maxexp, now) + retention
      if arm or keep_until > armed_until + retention / 2 then command, armed_until = 'PEXPIRE', keep_until end
    end
    -- The meta hash first: a TTL cannot be set on a key that does not exist yet.
    redis.call('HSET', M, 'rev', int(rev), 'complete', int(complete), 'created', int(created),
      'until', int(armed_until), 'maxexp', int(maxexp))
    for _, k in ipairs({M, E, X, F}) do
      if command == 'PERSIST' then
        redis.call('PERSIST', k)
      elseif command == 'PEXPIRE' then
        redis.call('PEXPIRE', k, int(armed_until - now))
      end
    end
    redis.call('PUBLISH', channel, int(rev))
  end
  return reply
end

-- A reply entry is {key, value, revision, updated-at, expires-at or -1}.
local function with_entry(reply, e)
  if e == nil then
    table.insert(reply, 0)
  else
    table.insert(reply, 1)
    for _, v in ipairs(e) do table.insert(reply, v) end
  end
  return reply
end

if op == 'get' then
  return finish(with_entry({now}, current(ARGV[6])))
elseif op == 'list' then
  local prefix = ARGV[6]
  local all = redis.call('HGETALL', E)
  local keys, packed = {}, {}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, #prefix) == prefix then
      table.insert(keys, all[i])
      packed[all[i]] = all[i + 1]
    end
  end
  -- Unsorted: Lua's string order follows the server's locale; the client sorts bytes.
  local reply = {now, rev, #keys}
  for _, k in ipairs(keys) do
    for _, v in ipairs(decode(k, packed[k])) do table.insert(reply, v) end
  end
  return finish(reply)
elseif op == 'put' or op == 'delete' or op == 'touch' then
  -- ARGV[6] key, ARGV[7] value, ARGV[8] ttl-ms or -1, ARGV[9] condition, ARGV[10] revision, ARGV[11] value
  local key, ttl, ctype = ARGV[6], tonumber(ARGV[8]), ARGV[9]
  local e = current(key)
  if (op ~= 'put' and e == nil) or not holds(e, ctype, tonumber(ARGV[10]), ARGV[11]) then
    return finish(with_entry({now, 0}, e))
  end
  if op == 'put' then
    local value = ARGV[7]
    local r = record('put', key, value, now)
    local expires = -1
    if ttl >= 0 then expires = now + ttl end
    e = {key, value, r, now, expires}
    store(e)
  elseif op == 'delete' then
    redis.call('HDEL', E, key)
    redis.call('ZREM', X, key)
    record('delete', key, '', now)
  else
    e[5] = now + ttl
    store(e)
  end
  return finish(with_entry({now, 1}, e))
elseif op == 'changes' then
  -- ARGV[6] after, ARGV[7] max. Reply {now, rev, gone-after or -1, n, (kind, key, value, revision, at)*}
  local after, max = tonumber(ARGV[6]), tonumber(ARGV[7])
  local fresh = after == 0 and complete == created
  if after > rev or (after < complete and not fresh) then
    return finish({now, rev, complete, 0})
  end
  local reply = {now, rev, -1, 0}
  if max > 0 then
    local msgs = redis.call('XRANGE', F, '(' .. int(after) .. '-0', '+', 'COUNT', max)
    reply[4] = #msgs
    for _, m in ipairs(msgs) do
      local f = {}
      for i = 1, #m[2], 2 do f[m[2][i]] = m[2][i + 1] end
      table.insert(reply, f.k)
      table.insert(reply, f.key)
      table.insert(reply, f.v)
      table.insert(reply, tonumber(string.match(m[1], '^(%d+)')))
      table.insert(reply, tonumber(f.at))
    end
  end
  return finish(reply)
elseif op == 'check' then
  -- For wait: {now, rev, the next expiry or -1}
  local first = redis.call('ZRANGE', X, 0, 0, 'WITHSCORES')
  local next_expiry = -1
  if #first > 0 then next_expiry = tonumber(first[2]) end
  return finish({now, rev, next_expiry})
end
return redis.error_reply('coord: unknown operation ' .. tostring(op))
