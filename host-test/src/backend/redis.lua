-- coord's store contract (wit/store.wit) for one partition, atomically.
--
-- KEYS[1] entries hash: '=' .. key -> "<revision>:<updated-at>:<expires-at or -1>:<value>"
--                       '#' -> the partition's meta, "<rev>:<created>:<until>:<maxexp>:<sweep>:<seq>":
--                         rev (latest revision), created (the floor this incarnation
--                         started from), until (the time the keys' TTLs were last armed
--                         to, -1 while an entry without TTL keeps them), maxexp (the
--                         latest expiry ever given to an entry), sweep (no entry expires
--                         before it, -1 when none has a TTL), seq (changes so far)
-- KEYS[2] expiry  zset: '=' .. key -> expires-at, for the sweep, and '#' at +inf,
--                       which keeps the key from vanishing when its last entry goes
-- KEYS[3] feed    stream: one message per change, id "<revision>-0", fields
--                       m = "<kind>:<at>:<previous revision>:<seq>", key, v (value)
--
-- The feed keeps exactly the last `history` changes, as the contract says,
-- but that is enforced when it is read: writes trim the stream approximately
-- (whole nodes, `MAXLEN ~`, about a third the cost of an exact trim), and a
-- reader treats every message more than `history` changes old as gone. Each
-- message names the revision before it, so a reader sees a gap without the
-- writer ever reading the feed.
-- Meta and entries share one hash so that one HMGET reads both and one HSET
-- writes both; with the sentinel, no key is ever emptied (and deleted) by
-- Redis while the partition lives, so TTLs need re-arming only when they
-- must reach further. All three keys share one hash tag: one cluster slot.
--
-- ARGV[1] operation, ARGV[2] '' (use Redis's TIME) or a test clock's now in ms, ARGV[3] history
-- (changes kept), ARGV[4] retention ms (how long the partition outlives its last
-- entry), ARGV[5] the channel to publish a partition's changes on, ARGV[6..] the
-- operation's arguments.
--
-- Revisions are seeded from the clock (at least now-ms * 1000), so a revision
-- issued after Redis lost its data still exceeds every revision before it.

local E, X, F = KEYS[1], KEYS[2], KEYS[3]
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
local single = op == 'get' or op == 'put' or op == 'delete' or op == 'touch'
local field = single and ('=' .. ARGV[6]) or nil

-- Integers print exactly with '%d' (a C long here) up to 2^53, and about
-- three times faster than with '%.0f', which matters at a dozen per call.
local function int(n)
  return string.format('%d', n)
end

-- One read for the meta and, for a single-key operation, its entry.
local meta, packed
if single then
  local both = redis.call('HMGET', E, '#', field)
  meta, packed = both[1], both[2]
else
  meta = redis.call('HGET', E, '#')
end
local rev, created, armed_until, maxexp, sweep, seq = 0, 0, 0, 0, -1, 0
if meta then
  local a, b, c, d, e, f = string.match(meta, '^(%d+):(%d+):(-?%d+):(%d+):(-?%d+):(%d+)$')
  rev, created, armed_until = tonumber(a), tonumber(b), tonumber(c)
  maxexp, sweep, seq = tonumber(d), tonumber(e), tonumber(f)
end
-- A new incarnation arms the keys' TTLs; a changed partition is published.
local arm = rev == 0
local dirty, meta_changed = false, false
local ttl_less = false
local pending = {} -- entry fields to write with the meta, in one HSET

local function next_revision()
  local floor = now * 1000
  if rev == 0 then
    -- A new incarnation: its feed is complete from here on, and nothing
    -- before it can be read from it.
    created = floor - 1
    rev = created
    redis.call('ZADD', X, '+inf', '#')
  end
  rev = math.max(rev + 1, floor)
  return rev
end

local function record(kind, key, value, at)
  local previous = rev
  local r = next_revision()
  if previous == 0 then previous = created end
  seq = seq + 1
  redis.call('XADD', F, 'MAXLEN', '~', history, int(r) .. '-0',
    'm', string.format('%s:%d:%d:%d', kind, at, previous, seq), 'key', key, 'v', value)
  dirty = true
  return r
end

local function pack_meta()
  return string.format('%d:%d:%d:%d:%d:%d', rev, created, armed_until, maxexp, sweep, seq)
end

local function decode(key, p)
  local r, u, x, rest = string.match(p, '^(%d+):(%d+):(-?%d+):()')
  return {key, string.sub(p, rest), tonumber(r), tonumber(u), tonumber(x)}
end

-- Store entry e, whose previous expiry was `before` (-1 for none or absent).
local function store(e, before)
  table.insert(pending, '=' .. e[1])
  table.insert(pending, string.format('%d:%d:%d:', e[3], e[4], e[5]) .. e[2])
  if e[5] >= 0 then
    redis.call('ZADD', X, int(e[5]), '=' .. e[1])
    maxexp = math.max(maxexp, e[5])
    if sweep < 0 or e[5] < sweep then sweep = e[5] end
  else
    if before >= 0 then redis.call('ZREM', X, '=' .. e[1]) end
    ttl_less = true
  end
  dirty = true
end

-- Record the expiry of every entry whose TTL has run out, in expiry order.
-- `sweep` is a lower bound on the earliest expiry, so most calls skip this.
if sweep >= 0 and sweep <= now then
  local due = redis.call('ZRANGEBYSCORE', X, '-inf', int(now), 'WITHSCORES')
  if #due > 0 then
    for i = 1, #due, 2 do
      redis.call('HDEL', E, due[i])
      record('expire', string.sub(due[i], 2), '', tonumber(due[i + 1]))
      if due[i] == field then packed = nil end
    end
    redis.call('ZREMRANGEBYSCORE', X, '-inf', int(now))
  end
  local first = redis.call('ZRANGE', X, 0, 0, 'WITHSCORES')
  sweep = -1
  if first[1] ~= nil and first[1] ~= '#' then sweep = tonumber(first[2]) end
  meta_changed = true
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
    -- costs three commands, so it is done only when the keys' TTLs would
    -- otherwise fall short by more than half the retention (they still
    -- outlive every entry by at least half of it), or the partition is new.
    local forever = ttl_less
    if armed_until == -1 and not forever then
      -- Does an entry without TTL remain? Count with this call's entries
      -- written; both counts include the meta field and the sentinel.
      if #pending > 0 then
        redis.call('HSET', E, unpack(pending))
        pending = {}
      end
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
    table.insert(pending, '#')
    table.insert(pending, pack_meta())
    -- The hash first: a TTL cannot be set on a key that does not exist yet.
    redis.call('HSET', E, unpack(pending))
    if command == 'PERSIST' then
      for _, k in ipairs({E, X, F}) do redis.call('PERSIST', k) end
    elseif command == 'PEXPIRE' then
      local ms = int(armed_until - now)
      for _, k in ipairs({E, X, F}) do redis.call('PEXPIRE', k, ms) end
    end
    redis.call('PUBLISH', channel, int(rev))
  elseif meta_changed and rev > 0 then
    -- Only the sweep bound moved: keep it, so the next call skips the sweep.
    redis.call('HSET', E, '#', pack_meta())
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

if single then
  local key = ARGV[6]
  local e = nil
  if packed then e = decode(key, packed) end
  if op == 'get' then
    return finish(with_entry({now}, e))
  end
  -- ARGV[7] value, ARGV[8] ttl-ms or -1, ARGV[9] condition, ARGV[10] revision, ARGV[11] value
  local ttl, ctype = tonumber(ARGV[8]), ARGV[9]
  if (op ~= 'put' and e == nil) or not holds(e, ctype, tonumber(ARGV[10]), ARGV[11]) then
    return finish(with_entry({now, 0}, e))
  end
  local before = -1
  if e ~= nil then before = e[5] end
  if op == 'put' then
    local value = ARGV[7]
    local r = record('put', key, value, now)
    local expires = -1
    if ttl >= 0 then expires = now + ttl end
    e = {key, value, r, now, expires}
    store(e, before)
  elseif op == 'delete' then
    redis.call('HDEL', E, field)
    if before >= 0 then redis.call('ZREM', X, field) end
    record('delete', key, '', now)
  else
    e[5] = now + ttl
    store(e, before)
  end
  return finish(with_entry({now, 1}, e))
elseif op == 'list' then
  local prefix = '=' .. ARGV[6]
  local all = redis.call('HGETALL', E)
  local keys, entries = {}, {}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, #prefix) == prefix then
      local k = string.sub(all[i], 2)
      table.insert(keys, k)
      entries[k] = all[i + 1]
    end
  end
  -- Unsorted: Lua's string order follows the server's locale; the client sorts bytes.
  local reply = {now, rev, #keys}
  for _, k in ipairs(keys) do
    for _, v in ipairs(decode(k, entries[k])) do table.insert(reply, v) end
  end
  return finish(reply)
elseif op == 'changes' then
  -- ARGV[6] after, ARGV[7] max. Reply {now, rev, gone-after or -1, n, (kind, key, value, revision, at)*}
  local after, max = tonumber(ARGV[6]), tonumber(ARGV[7])
  -- 0 reads from the first change of this incarnation; a revision from
  -- before it was issued before the partition lost its data.
  local lost = false
  if after == 0 and rev > 0 then
    after = created
  elseif after < created then
    after, lost = created, true
  end
  if after > rev then
    -- From the future: the partition lost what the reader saw.
    return finish({now, rev, created, 0})
  end
  local oldest_kept = seq - history + 1 -- the first change the contract keeps
  local function parse(m)
    local f = {}
    for i = 1, #m[2], 2 do f[m[2][i]] = m[2][i + 1] end
    local kind, at, previous, s = string.match(f.m, '^(%a+):(%d+):(%d+):(%d+)$')
    return {kind, f.key, f.v, tonumber(string.match(m[1], '^(%d+)')), tonumber(at)}, tonumber(previous), tonumber(s)
  end
  local msgs = {}
  if after < rev then
    msgs = redis.call('XRANGE', F, '(' .. int(after) .. '-0', '+', 'COUNT', math.max(max, 1))
    local first, previous, s = nil, nil, nil
    if #msgs > 0 then first, previous, s = parse(msgs[1]) end
    if first == nil then
      -- Nothing kept after `after` although changes were made: lost.
      return finish({now, rev, rev, 0})
    elseif s < oldest_kept then
      -- Past the history: complete only after the last change it dropped.
      local upto = redis.call('XRANGE', F, '(' .. int(after) .. '-0', '+', 'COUNT', oldest_kept - s)
      return finish({now, rev, tonumber(string.match(upto[#upto][1], '^(%d+)')), 0})
    elseif previous > after then
      -- The change before the first kept one is newer than `after`: a gap.
      return finish({now, rev, previous, 0})
    end
  end
  if lost then return finish({now, rev, created, 0}) end
  local reply = {now, rev, -1, 0}
  if max > 0 then
    reply[4] = #msgs
    for _, m in ipairs(msgs) do
      for _, v in ipairs((parse(m))) do table.insert(reply, v) end
    end
  end
  return finish(reply)
elseif op == 'check' then
  -- For wait: {now, rev, the next expiry or -1}; after the sweep above,
  -- read it exactly rather than trust the lower bound.
  local first = redis.call('ZRANGE', X, 0, 0, 'WITHSCORES')
  local next_expiry = -1
  if first[1] ~= nil and first[1] ~= '#' then next_expiry = tonumber(first[2]) end
  return finish({now, rev, next_expiry})
end
return redis.error_reply('coord: unknown operation ' .. tostring(op))
