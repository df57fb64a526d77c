-- coord's store contract (wit/store.wit) for one partition, atomically.
--
-- KEYS[1] entries hash: '=' .. key -> struct.pack('<ddd', revision, updated-at,
--                       expires-at or -1) .. value
--                       '#' -> the partition's meta, struct.pack('<Bdddddd', 2, rev,
--                         created, until, maxexp, sweep, seq): 2 (the layout's version),
--                         rev (latest revision), created (the floor this incarnation
--                         started from), until (the time the keys' TTLs were last armed
--                         to, -1 while an entry without TTL keeps them), maxexp (the
--                         latest expiry ever given to an entry), sweep (no entry expires
--                         before it, -1 when none has a TTL), seq (changes so far)
-- KEYS[2] expiry  zset: '=' .. key for every entry with a TTL, scored with a lower
--                       bound of its expires-at, for the sweep; and '#' at +inf,
--                       which keeps the key from vanishing when its last entry goes
-- KEYS[3] feed    stream: one message per change, id "<revision>-0", one field
--                       m = struct.pack('<dddI4', at, previous revision, seq, #key)
--                         .. kind ('p' put, 'd' delete, 'e' expire) .. key .. value
--
-- Numbers are stored packed as doubles by Redis's bundled `struct` library
-- (every one here is an integer below 2^53, exact in a double). Stored as
-- text, parsing and printing them (string.match, tonumber, string.format)
-- took a quarter of the script's instructions under callgrind, and more in
-- collecting the garbage they left (BENCHMARKS.md, "Instruction counts: where the time goes").
-- Numbers a command needs as text go through `int`: redis.call prints a Lua
-- number with '%.17g', which callgrind counted at about 2.5 times the
-- instructions.
--
-- The feed keeps exactly the last `history` changes, as the contract says,
-- but that is enforced when it is read: writes trim the stream approximately
-- (whole nodes, `MAXLEN ~`, about a third the cost of an exact trim), and a
-- reader treats every message more than `history` changes old as gone. Each
-- message names the revision before it, so a reader sees a gap without the
-- writer ever reading the feed.
-- An index score is only a lower bound of the entry's expiry: a write that
-- moves an expiry later (a touch, an upsert) leaves the score where it was,
-- which saves a ZADD on the commonest writes (callgrind: a ZADD into a
-- 100-entry listpack costs about a sixth of an upsert). When the score
-- passes, the sweep reads the entry's own expiry and either expires it or
-- moves the score up to it.
-- Meta and entries share one hash so that one HMGET reads both and one HSET
-- writes both; with the sentinel, no key is ever emptied (and deleted) by
-- Redis while the partition lives, so TTLs need re-arming only when they
-- must reach further. All three keys share one hash tag: one cluster slot.
--
-- The backend loads this script behind one line of its configuration,
--   local HISTORY, RETENTION, PUBLISH = '<changes kept>', <ms the partition
--     outlives its last entry>, '<PUBLISH, or SPUBLISH on a cluster>'
-- (HISTORY as the text XADD takes), so neither travels with every call: each
-- argument costs Redis a string and a slot in ARGV (callgrind: about 1 000
-- instructions), and a number in it a `tonumber` as well.
--
-- ARGV[1] operation, ARGV[2] '' (use Redis's TIME), '-d' (use Redis's TIME,
-- and past the deadline d in ms on it change nothing and answer the error
-- LATE: the caller has answered `unavailable` by then, and a call held in a
-- paused server must not apply afterwards) or a test clock's now in ms,
-- ARGV[3] the channel to publish a partition's changes on, ARGV[4..] the
-- operation's arguments, only those it uses:
--   get     key
--   put     key, value, ttl-ms or -1, condition
--   touch   key, ttl-ms, condition
--   delete  key, condition
--   list    prefix
--   changes after, max
--   check   (none)
-- A condition is its type ('always', 'absent', 'revision',
-- 'revision-and-value', 'absent-and-fewer-than'), then the revision for
-- 'revision' and 'revision-and-value', then the value for the latter; the
-- limit for 'absent-and-fewer-than'.
--
-- Revisions are seeded from the clock in microseconds (each is at least
-- Redis's TIME as microseconds when it is issued), so a revision issued after
-- Redis lost its data still exceeds every revision before it: a restart or a
-- FLUSHALL and the next write take more than a microsecond, and no partition
-- takes a write per microsecond. (Seeded from milliseconds, times 1000, the
-- first revision after a loss within the same millisecond as the last write
-- repeated that write's revision.)

local E, X, F = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]
-- The store's clock: `now` in milliseconds for TTLs and replies, `clock_us`
-- in microseconds for the floor of new revisions.
local now, clock_us
local given = ARGV[2]
local deadline = given ~= '' and -tonumber(given)
if given == '' or deadline > 0 then
  local t = redis.call('TIME')
  local seconds, micros = tonumber(t[1]), tonumber(t[2])
  now = seconds * 1000 + math.floor(micros / 1000)
  clock_us = seconds * 1000000 + micros
  if deadline and now > deadline then
    return redis.error_reply('LATE the call ran past its deadline; nothing was applied')
  end
else
  now = -deadline -- a test's manual clock
  clock_us = now * 1000
end
-- An integer as the text a command takes.
local function int(n)
  return string.format('%d', n)
end

local single = op == 'put' or op == 'delete' or op == 'touch' or op == 'get'
local key = ARGV[4]
local field = single and ('=' .. key) or nil

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
  if #meta ~= 49 or string.byte(meta) ~= 2 then
    -- Written by an earlier coord: refuse rather than misread it. Its keys
    -- carry TTLs, so the partition ends by itself.
    return redis.error_reply('coord: partition ' .. E .. ' is in an older layout')
  end
  local _
  _, rev, created, armed_until, maxexp, sweep, seq = struct.unpack('<Bdddddd', meta)
end
-- A new incarnation arms the keys' TTLs; a changed partition is published.
local arm = rev == 0
local dirty, meta_changed, ttl_less = false, false, false
local set_entry = nil -- the key's entry to write with the meta, in one HSET

-- Append a change to the feed under the next revision. The partition's
-- counters go in as arguments and come back updated (rev, created, seq, and
-- the new revision as text, for XADD and PUBLISH), so the function closes
-- over nothing: built on every call as a closure over the locals it used,
-- it cost Redis an upvalue apiece (callgrind: `luaF_findupval`, 4 200
-- instructions per lock pair; BENCHMARKS.md, "Instruction counts: where the time goes").
-- `floor` is the clock in microseconds: no revision is issued below it.
local function record(F, X, history, floor, rev, created, seq, kind, changed_key, value, at)
  local previous = rev
  if rev == 0 then
    -- A new incarnation: its feed is complete from here on, and nothing
    -- before it can be read from it.
    created = floor - 1
    previous = created
    redis.call('ZADD', X, '+inf', '#')
  end
  rev = previous + 1
  if rev < floor then rev = floor end
  seq = seq + 1
  local rev_text = string.format('%d', rev)
  redis.call('XADD', F, 'MAXLEN', '~', history, rev_text, 'm',
    struct.pack('<dddI4', at, previous, seq, #changed_key) .. kind .. changed_key .. value)
  return rev, created, seq, rev_text
end
local rev_text = nil -- the latest revision as text, once `record` has run

-- Record the expiry of every entry whose TTL has run out, in expiry order.
-- `sweep` is a lower bound on the earliest expiry, so most calls skip this.
if sweep >= 0 and sweep <= now then
  -- redis.call(command, key, ...list) in slices, as `unpack` takes only so
  -- many values at once (`step` even, for ZADD's score-member pairs). Returns
  -- the replies of a command that answers with an array, concatenated.
  local function call_in_slices(command, key, list, step)
    local out = {}
    for i = 1, #list, step do
      local part = redis.call(command, key, unpack(list, i, math.min(i + step - 1, #list)))
      if type(part) == 'table' then
        for j = 1, #part do out[#out + 1] = part[j] end
      end
    end
    return out
  end
  local due = redis.call('ZRANGEBYSCORE', X, '-inf', int(now))
  if #due > 0 then
    -- The scores are lower bounds: each entry's header has its real expiry.
    local headers = call_in_slices('HMGET', E, due, 512)
    local expired, later = {}, {}
    for i = 1, #due do
      local h = headers[i]
      if h then
        local _, _, exp = struct.unpack('<ddd', h)
        if exp > now then
          later[#later + 1] = int(exp)
          later[#later + 1] = due[i]
        elseif exp >= 0 then
          expired[#expired + 1] = {exp, due[i]}
        end
      end
    end
    redis.call('ZREMRANGEBYSCORE', X, '-inf', int(now))
    if #later > 0 then call_in_slices('ZADD', X, later, 512) end
    if #expired > 0 then
      table.sort(expired, function(a, b)
        if a[1] ~= b[1] then return a[1] < b[1] end
        return a[2] < b[2]
      end)
      local fields = {}
      for i = 1, #expired do fields[i] = expired[i][2] end
      call_in_slices('HDEL', E, fields, 512)
      for i = 1, #expired do
        local f = fields[i]
        rev, created, seq, rev_text =
          record(F, X, HISTORY, clock_us, rev, created, seq, 'e', string.sub(f, 2), '', expired[i][1])
        dirty = true
        if f == field then packed = nil end
      end
    end
  end
  local first = redis.call('ZRANGE', X, 0, 0, 'WITHSCORES')
  sweep = -1
  if first[1] ~= nil and first[1] ~= '#' then sweep = tonumber(first[2]) end
  meta_changed = true
end

-- Each operation leaves its answer in `reply`; the code after them persists
-- the partition's state and wakes its waiters. (It was a local function,
-- `finish`, called at every return: a closure over twenty locals, which
-- Lua builds afresh on every call. callgrind counted 5 100 instructions per
-- call in finding the closures' upvalues, `luaF_findupval`, then 2 100.)
--
-- A write that did not apply answers {now, 0, rev, 0} or {now, 0, rev, 1,
-- entry}, rev being the partition's revision; a reply entry is key, value,
-- revision, updated-at, expires-at or -1.
-- An applied write answers instead with one string, struct.pack('<Bddddd',
-- with_value, now, rev, revision, updated-at, expires-at) .. value: Redis turns
-- one string into RESP for much less than the eight elements of an array
-- (callgrind: 7 % of a lock pair). The value is left out (with_value 0)
-- where the caller sent it itself: a put's value, or a guard's value.
local reply
if single then
  -- The key's entry, if it has one (after the sweep above).
  local value, erev, eupd, eexp
  if packed then
    erev, eupd, eexp = struct.unpack('<ddd', packed)
    value = string.sub(packed, 25)
  end
  if op == 'get' then
    if erev == nil then
      reply = {now, 0}
    else
      reply = {now, 1, key, value, erev, eupd, eexp}
    end
  else
    -- The operation's own arguments (see the header), then the condition.
    local new_value, ttl_text, c = nil, nil, 5
    if op == 'put' then
      new_value, ttl_text, c = ARGV[5], ARGV[6], 7
    elseif op == 'touch' then
      ttl_text, c = ARGV[5], 6
    end
    local ctype = ARGV[c]
    local holds
    local full = false -- absent-and-fewer-than failed on the count
    if ctype == 'always' then
      holds = op == 'put' or erev ~= nil
    elseif ctype == 'absent' then
      holds = op == 'put' and erev == nil
    elseif ctype == 'absent-and-fewer-than' then
      holds = op == 'put' and erev == nil
      -- After the sweep every entry left is live: the hash's fields, less
      -- the meta.
      if holds then
        local live = redis.call('HLEN', E)
        if meta then live = live - 1 end
        full = live >= tonumber(ARGV[c + 1])
        holds = not full
      end
    elseif erev == nil then
      holds = false
    elseif ctype == 'revision' then
      holds = erev == tonumber(ARGV[c + 1])
    else
      holds = erev == tonumber(ARGV[c + 1]) and value == ARGV[c + 2]
    end
    local before = eexp or -1
    if not holds then
      if full then
        -- The live entry that expires first, the least key among equals
        -- (as the memory store answers). Index scores are only lower bounds
        -- of expiries, so the index is walked from its lowest score, each
        -- entry's own header deciding, until a score passes the earliest
        -- expiry found: a few reads, however many entries the partition
        -- holds (a full semaphore of 10 000 permits answers busy as cheaply
        -- as one of 3). Only when no entry expires is the whole hash read,
        -- for its least key.
        local best, best_x, best_stored
        local from, done = 0, false
        while not done do
          local batch = redis.call('ZRANGE', X, from, from + 15, 'WITHSCORES')
          done = #batch < 32
          for i = 1, #batch, 2 do
            local f = batch[i]
            if f == '#' or (best_x ~= nil and tonumber(batch[i + 1]) > best_x) then
              done = true
              break
            end
            local stored = redis.call('HGET', E, f)
            if stored then
              local _, _, x = struct.unpack('<ddd', stored)
              if x >= 0 and (best_x == nil or x < best_x or (x == best_x and f < best)) then
                best, best_x, best_stored = f, x, stored
              end
            end
          end
          from = from + 16
        end
        if best == nil then
          local all = redis.call('HGETALL', E)
          for i = 1, #all, 2 do
            if string.byte(all[i]) == 61 and (best == nil or all[i] < best) then
              best, best_stored = all[i], all[i + 1]
            end
          end
        end
        if best == nil then
          reply = {now, 0, rev, 0}
        else
          local r, u, x = struct.unpack('<ddd', best_stored)
          reply = {now, 0, rev, 1, string.sub(best, 2), string.sub(best_stored, 25), r, u, x}
        end
      elseif erev == nil then
        reply = {now, 0, rev, 0}
      else
        reply = {now, 0, rev, 1, key, value, erev, eupd, eexp}
      end
    elseif op == 'delete' then
      redis.call('HDEL', E, field)
      if before >= 0 then redis.call('ZREM', X, field) end
      rev, created, seq, rev_text = record(F, X, HISTORY, clock_us, rev, created, seq, 'd', key, '', now)
      dirty = true
      if ctype == 'revision-and-value' then
        reply = struct.pack('<Bddddd', 0, now, rev, erev, eupd, eexp)
      else
        reply = struct.pack('<Bddddd', 1, now, rev, erev, eupd, eexp) .. value
      end
    else
      if op == 'put' then
        value = new_value
        rev, created, seq, rev_text = record(F, X, HISTORY, clock_us, rev, created, seq, 'p', key, value, now)
        erev, eupd = rev, now
      end
      local ttl = tonumber(ttl_text)
      eexp = -1
      if ttl >= 0 then eexp = now + ttl end
      -- Store the entry with the meta, and index its expiry for the sweep.
      set_entry = struct.pack('<ddd', erev, eupd, eexp) .. value
      if eexp >= 0 then
        -- An expiry no earlier than the indexed one keeps its lower bound.
        if before < 0 or eexp < before then
          redis.call('ZADD', X, int(eexp), field)
          if sweep < 0 or eexp < sweep then sweep = eexp end
        end
        if eexp > maxexp then maxexp = eexp end
      else
        if before >= 0 then redis.call('ZREM', X, field) end
        ttl_less = true
      end
      dirty = true
      if op == 'put' or ctype == 'revision-and-value' then
        reply = struct.pack('<Bddddd', 0, now, rev, erev, eupd, eexp)
      else
        reply = struct.pack('<Bddddd', 1, now, rev, erev, eupd, eexp) .. value
      end
    end
  end
elseif op == 'list' then
  -- One string, as an array of five elements per entry cost Redis more to
  -- turn into RESP than the listing itself (callgrind): struct.pack('<dd',
  -- now, rev), then per entry struct.pack('<I4I4', #field, #stored) .. field
  -- .. stored, the hash's field ('=' .. key) and value (header and value) as
  -- they are kept. Unsorted: Lua's string order follows the server's
  -- locale; the client sorts bytes.
  local prefix = '=' .. ARGV[4]
  local filter = #prefix > 1
  local all = redis.call('HGETALL', E)
  local parts, n = {struct.pack('<dd', now, rev)}, 1
  for i = 1, #all, 2 do
    local f = all[i]
    -- '=' (byte 61) marks an entry; the meta is '#'.
    if string.byte(f) == 61 and (not filter or string.sub(f, 1, #prefix) == prefix) then
      local p = all[i + 1]
      parts[n + 1], parts[n + 2], parts[n + 3] = struct.pack('<I4I4', #f, #p), f, p
      n = n + 3
    end
  end
  reply = table.concat(parts)
elseif op == 'changes' then
  -- ARGV[4] after, ARGV[5] max. Reply: a packed page (below), or when the
  -- history no longer reaches `after`, {now, rev, the revision after which it is complete, 0}.
  local function page()
    local after, max = tonumber(ARGV[4]), tonumber(ARGV[5])
    local history = tonumber(HISTORY)
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
      return {now, rev, created, 0}
    end
    local oldest_kept = seq - history + 1 -- the first change the contract keeps
    local kinds = {p = 'put', d = 'delete', e = 'expire'}
    local function id_revision(id)
      return tonumber(string.match(id, '^(%d+)'))
    end
    -- A message as {kind, key, value, revision, at}, its previous revision and its seq.
    local function parse(msg)
      local p = msg[2][2]
      local at, previous, s, key_len, pos = struct.unpack('<dddI4', p)
      local kind = kinds[string.sub(p, pos, pos)]
      local changed_key = string.sub(p, pos + 1, pos + key_len)
      return {kind, changed_key, string.sub(p, pos + 1 + key_len), id_revision(msg[1]), at}, previous, s
    end
    local msgs = {}
    if after < rev then
      msgs = redis.call('XRANGE', F, '(' .. int(after) .. '-0', '+', 'COUNT', math.max(max, 1))
      local first, previous, s = nil, nil, nil
      if #msgs > 0 then first, previous, s = parse(msgs[1]) end
      if first == nil then
        -- Nothing kept after `after` although changes were made: lost.
        return {now, rev, rev, 0}
      elseif s < oldest_kept then
        -- Past the history: complete only after the last change it dropped.
        local upto = redis.call('XRANGE', F, '(' .. int(after) .. '-0', '+', 'COUNT', oldest_kept - s)
        return {now, rev, id_revision(upto[#upto][1]), 0}
      elseif previous > after then
        -- The change before the first kept one is newer than `after`: a gap.
        return {now, rev, previous, 0}
      end
    end
    if lost then return {now, rev, created, 0} end
    -- A page is one string, like a listing: struct.pack('<dd', now, rev), then
    -- per change struct.pack('<I4I4', #id, #message) .. id .. message, the
    -- stream's id and message as they are kept.
    local parts, n = {struct.pack('<dd', now, rev)}, 1
    if max > 0 then
      for i = 1, #msgs do
        local id, message = msgs[i][1], msgs[i][2][2]
        parts[n + 1], parts[n + 2], parts[n + 3] = struct.pack('<I4I4', #id, #message), id, message
        n = n + 3
      end
    end
    return table.concat(parts)
  end
  reply = page()
elseif op == 'check' then
  -- For wait: {now, rev, the next expiry or -1}; after the sweep above,
  -- the lowest index score, which is later than now and no later than the
  -- next expiry (a waiter woken early just checks again).
  local first = redis.call('ZRANGE', X, 0, 0, 'WITHSCORES')
  local next_expiry = -1
  if first[1] ~= nil and first[1] ~= '#' then next_expiry = tonumber(first[2]) end
  reply = {now, rev, next_expiry}
else
  return redis.error_reply('coord: unknown operation ' .. tostring(op))
end

-- Persist the partition's state, keep its keys alive as long as an entry or
-- the retention needs them, and wake the partition's waiters.
if dirty then
  -- Keep the keys until the latest expiry plus the retention. Re-arming
  -- costs three commands, so it is done only when the keys' TTLs would
  -- otherwise fall short by more than half the retention (they still
  -- outlive every entry by at least half of it), or the partition is new.
  local forever = ttl_less
  if armed_until == -1 and not forever then
    -- Does an entry without TTL remain? Count with this call's entry
    -- written; both counts include the meta field and the sentinel.
    if set_entry then
      redis.call('HSET', E, field, set_entry)
      set_entry = nil
    end
    forever = redis.call('HLEN', E) > redis.call('ZCARD', X)
    arm = arm or not forever
  end
  local command = nil
  if forever then
    if armed_until ~= -1 then command, armed_until = 'PERSIST', -1 end
  else
    local keep_until = (maxexp > now and maxexp or now) + RETENTION
    if arm or keep_until > armed_until + RETENTION / 2 then command, armed_until = 'PEXPIRE', keep_until end
  end
  local m = struct.pack('<Bdddddd', 2, rev, created, armed_until, maxexp, sweep, seq)
  -- The hash first: a TTL cannot be set on a key that does not exist yet.
  if set_entry then
    redis.call('HSET', E, field, set_entry, '#', m)
  else
    redis.call('HSET', E, '#', m)
  end
  if command == 'PERSIST' then
    redis.call('PERSIST', E)
    redis.call('PERSIST', X)
    redis.call('PERSIST', F)
  elseif command == 'PEXPIRE' then
    local ms = int(armed_until - now)
    redis.call('PEXPIRE', E, ms)
    redis.call('PEXPIRE', X, ms)
    redis.call('PEXPIRE', F, ms)
  end
  redis.call(PUBLISH, ARGV[3], rev_text or int(rev))
elseif meta_changed and rev > 0 then
  -- Only the sweep bound moved: keep it, so the next call skips the sweep.
  redis.call('HSET', E, '#', struct.pack('<Bdddddd', 2, rev, created, armed_until, maxexp, sweep, seq))
end
return reply
