"""Lua scripts of the Redis prefix index (see `redis_index` for the key schema they implement).

Each public operation is one script, so it is atomic and costs one round trip. A script gets its model's
base (or a key under it) as KEYS[1] and builds the other key names from it: a slot's old blocks are only
known inside Redis. The base carries a hash tag (`P:{M}:`), so on Redis Cluster every key a script
touches lives in the hash slot of KEYS[1], the slot a cluster client sends the script to.

Time is the server's (`TIME`), not the caller's: router replicas with skewed clocks then agree on what
has expired.
"""

from __future__ import annotations

PRELUDE = """
if redis.replicate_commands then redis.replicate_commands() end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Never shorten a key's life: other entries in it may have later deadlines.
local function extend(key, ttl)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end
-- A snapshot id leaves the set of its last block; the block leaves `snaplast` when no snapshot ends there.
local function drop_snapshot(base, last, id)
  local key = base .. 'snap:' .. last
  redis.call('ZREM', key, id)
  if redis.call('ZCARD', key) == 0 then redis.call('SREM', base .. 'snaplast', last) end
end
-- The slot `skey` drops its tags unless it keeps them (`conv`, `head`: what it is recorded with now);
-- a conversation's pointer goes only if it still names this slot (the conversation may have moved).
local function untag(base, skey, member, conv, head)
  local old = redis.call('HMGET', skey, 'conv', 'head')
  if old[1] and old[1] ~= '' and old[1] ~= conv then
    local key = base .. 'conv:' .. old[1]
    if redis.call('GET', key) == member then redis.call('DEL', key) end
  end
  if old[2] and old[2] ~= '' and old[2] ~= head then redis.call('SREM', base .. 'head:' .. old[2], member) end
end
-- Expired members are dropped when a member joins: a set grows only then, and a slot refreshing the
-- 250 blocks it holds already (one command fewer each) is most of a full record's time in Redis.
local function add_member(key, deadline, member, now, ttl)
  if redis.call('ZADD', key, deadline, member) == 1 then redis.call('ZREMRANGEBYSCORE', key, '-inf', now) end
  extend(key, ttl)
end
-- The i-th hash of a chain sent or stored as one string of `width`-wide hashes.
local function nth(blob, width, i) return string.sub(blob, (i - 1) * width + 1, i * width) end
local function split(blob, width)
  local chain = {}
  for i = 1, math.floor(#blob / width) do chain[i] = nth(blob, width, i) end
  return chain
end
-- How many whole blocks two chains of `width`-wide hashes share at their start (a binary search of
-- prefix comparisons: each is one C-level string comparison).
local function common_blocks(a, b, width)
  local lo, hi = 0, math.floor(math.min(#a, #b) / width)
  if string.sub(a, 1, hi * width) == string.sub(b, 1, hi * width) then return hi end
  while lo + 1 < hi do  -- the first `lo` blocks are shared, the first `hi` are not
    local mid = math.floor((lo + hi) / 2)
    if string.sub(a, 1, mid * width) == string.sub(b, 1, mid * width) then lo = mid else hi = mid end
  end
  return lo
end
-- The chain a slot's hash holds: `chain` (one string of `w`-wide hashes), or `blocks` (a JSON list: hashes
-- of mixed widths, and the records of versions before 2026-12-07).
local function stored_chain(fields)
  if fields[1] then return split(fields[1], tonumber(fields[2])) end
  if fields[3] then return cjson.decode(fields[3]) end
  return {}
end
"""

# KEYS: base, the pod's set in this model; ARGV: slot key, ttl ms, n_tokens, conversation tag, head tag
# ('' for none), width, then the block hashes (one string of fixed-width hashes when width > 0, as in
# LOOKUP) -> number of blocks recorded. The tags go to the slot's hash, `conv:{tag}` -> slot key and
# the set `head:{tag}`; a record without them (or with others) drops the old ones (a conversation's
# pointer only while it still names this slot).
# A slot re-recorded within the first tenth of its TTL (a session's next turn: the same prefix plus a
# new tail) only adds its new blocks: refreshing all 240 block sets cost ~4 commands each. The slot's
# stored `deadline` stays the EARLIEST deadline of its blocks, so the next record after that tenth
# refreshes everything and no block outlives its slot or expires under a live one. Chains are stored as
# one string too: the prefix both chains share is found with a few string comparisons, and only the
# two tails beyond it are cut into hashes and diffed (splitting and diffing both 250-hash chains was
# most of a record's ~130 us in Redis; a session's next turn now costs ~20 us).
RECORD_SLOT = PRELUDE + """
local base, podkey, member, ttl, ntok = KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local conv, head, width = ARGV[4], ARGV[5], tonumber(ARGV[6])
local now = now_ms()
local deadline = now + ttl
local skey = base .. 'slot:' .. member
local chain, blob = {}, nil
if width > 0 then blob = ARGV[7] else for i = 7, #ARGV do chain[#chain + 1] = ARGV[i] end end
local n = blob and math.floor(#blob / width) or #chain
if n == 0 then conv, head = '', '' end
untag(base, skey, member, conv, head)
local old = redis.call('HMGET', skey, 'chain', 'w', 'blocks', 'deadline')
local old_deadline = tonumber(old[4] or 0)
local fresh = old_deadline - now > ttl * 0.9
-- `same`: the blocks the slot held and holds again, as a prefix of both chains. Beyond it, the chains
-- part for good (a hash covers everything before it), so only the two tails need comparing.
local same, prev = 0, nil
if blob and old[1] and tonumber(old[2]) == width then
  same = common_blocks(old[1], blob, width)
  prev = split(string.sub(old[1], same * width + 1), width)
else
  prev = stored_chain(old)
end
local tail = chain
if blob then tail = split(string.sub(blob, same * width + 1), width) end
local new, held = {}, {}
for _, h in ipairs(tail) do new[h] = true end
for _, h in ipairs(prev) do
  if not new[h] then redis.call('ZREM', base .. 'b:' .. h, member)
  elseif fresh then held[h] = true end
end
local stored = fresh and old_deadline or deadline
local podentry = cjson.encode({'s', base, member})
if n == 0 then
  redis.call('DEL', skey)
  redis.call('SREM', podkey, podentry)
  return 0
end
if not fresh then  -- the shared prefix's entries expire first: refresh them
  for i = 1, same do
    add_member(base .. 'b:' .. nth(blob, width, i), deadline, member, now, ttl)
  end
end
for _, h in ipairs(tail) do
  if not held[h] then add_member(base .. 'b:' .. h, deadline, member, now, ttl) end
end
if blob then
  redis.call('HSET', skey, 'chain', blob, 'w', width, 'n_tokens', ntok, 'deadline', stored, 'conv', conv,
             'head', head)
  if old[3] then redis.call('HDEL', skey, 'blocks') end
else
  redis.call('HSET', skey, 'blocks', cjson.encode(chain), 'n_tokens', ntok, 'deadline', stored, 'conv', conv,
             'head', head)
  if old[1] then redis.call('HDEL', skey, 'chain', 'w') end
end
redis.call('PEXPIRE', skey, ttl)
if conv ~= '' then redis.call('SET', base .. 'conv:' .. conv, member, 'PX', ttl) end
if head ~= '' then
  redis.call('SADD', base .. 'head:' .. head, member)
  extend(base .. 'head:' .. head, ttl)
end
redis.call('SADD', podkey, podentry)
extend(podkey, ttl)
return n
"""

# KEYS: base; ARGV: width, conversation tag, head tag ('' for none), head blocks, then the block hashes: when
# width > 0, ONE string of fixed-width hashes (the common case: packing 240 separate arguments cost the
# client more than the whole script costs Redis), else one argument per hash.
#   -> {"snapshot json\n...", "slotkey of the conversation's slot, or empty",
#       "slotkey\n..." of the run-`head blocks` slots holding the head exactly, run, "slotkey\n...", ...}
# Slots. Chained hashes make membership monotone: a slot in block i's set is in the sets of blocks
# 0..i, so c(i), the number of live members of block i's set, never grows with i, and a slot's run ends
# where it leaves the sets. Find the D drop points of c with a binary search of ZCOUNTs (O(D log n)),
# then either diff the live members at each drop point (cheap when D is small, the usual case: slots
# sharing a prefix diverge together) or binary-search each slot over the drop points with ZSCORE
# (O(slots log D), for many distinct run lengths), whichever touches less. ZDIFF measured slower than
# the diff in Lua. A walk of every block costs n * slots instead. Slots come back grouped by run length,
# so a group that a whole set makes up is joined in C (`table.concat`), not member by member in Lua.
# Snapshots: which query blocks end some snapshot? When few blocks do in the whole model (`snaplast`), each
# is searched for in the query string at a hash boundary; else one SMISMEMBER over the query's hashes.
# Only those blocks' snapshots are read. The query is cut into hashes only where a step needs one:
# cutting all 250 was a quarter of a lookup's time in Redis.
LOOKUP = PRELUDE + """
local base, width, conv, head, hb = KEYS[1], tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])
local q, blob = {}, nil
if width > 0 then blob = ARGV[5] else for i = 5, #ARGV do q[#q + 1] = ARGV[i] end end
local n = blob and math.floor(#blob / width) or #q
-- The query's i-th hash, cut from the blob when first needed: the searches below read ~20 of 250.
local function hash(i)
  local h = q[i]
  if h == nil then
    h = nth(blob, width, i)
    q[i] = h
  end
  return h
end
local now = now_ms()
local lo = '(' .. now
local function bkey(i) return base .. 'b:' .. hash(i) end
local function count(i) return redis.call('ZCOUNT', bkey(i), lo, '+inf') end
local function live(i) return redis.call('ZRANGEBYSCORE', bkey(i), lo, '+inf') end
local groups, exact = {}, {}
local function group(run, members)
  if #members > 0 then
    groups[#groups + 1] = run
    groups[#groups + 1] = table.concat(members, '\\n')
    -- Slots parting from the query exactly where the head's whole blocks end: which hold the head?
    if run == hb and head ~= '' then
      for at = 1, #members, 1000 do  -- unpack has a stack limit
        local part = {unpack(members, at, math.min(at + 999, #members))}
        local flags = redis.call('SMISMEMBER', base .. 'head:' .. head, unpack(part))
        for i, m in ipairs(part) do if flags[i] == 1 then exact[#exact + 1] = m end end
      end
    end
  end
end
local c1 = n >= 1 and count(1) or 0
if c1 > 0 then
  local cn = n > 1 and count(n) or c1
  -- 1. The drop points: positions a where c(a) > c(a + 1).
  local drops, stack = {}, {{1, c1, n, cn}}
  while #stack > 0 do
    local seg = table.remove(stack)
    local a, ca, b, cb = seg[1], seg[2], seg[3], seg[4]
    if ca ~= cb and b == a + 1 then
      drops[#drops + 1] = {a, ca, cb}
    elseif ca ~= cb then
      local mid = math.floor((a + b) / 2)
      local cm = count(mid)
      stack[#stack + 1] = {a, ca, mid, cm}
      stack[#stack + 1] = {mid, cm, b, cb}
    end
  end
  table.sort(drops, function(x, y) return x[1] < y[1] end)
  -- 2. Who leaves where. Diffing member lists touches sum(c(a) + c(a + 1)) members; a binary search
  -- per slot over the run ends makes c1 * log2(ends) ZSCORE calls (about 6 member steps each).
  local ends, diff_cost = {}, 0
  for _, d in ipairs(drops) do ends[#ends + 1] = d[1]; diff_cost = diff_cost + d[2] + d[3] end
  if cn > 0 then ends[#ends + 1] = n end
  if c1 * math.ceil(math.log(#ends + 1) / math.log(2)) * 6 < diff_cost then
    local by_end = {}
    for _, m in ipairs(live(1)) do
      local lo_i, hi_i = 1, #ends  -- every candidate holds ends[1]: no run is shorter
      while lo_i < hi_i do
        local mid = math.ceil((lo_i + hi_i) / 2)
        local score = redis.call('ZSCORE', bkey(ends[mid]), m)
        if score and tonumber(score) > now then lo_i = mid else hi_i = mid - 1 end
      end
      local bucket = by_end[lo_i]
      if bucket == nil then bucket = {}; by_end[lo_i] = bucket end
      bucket[#bucket + 1] = m
    end
    for i = 1, #ends do if by_end[i] then group(ends[i], by_end[i]) end end
  else
    for _, d in ipairs(drops) do
      local a, cb = d[1], d[3]
      if cb == 0 then
        group(a, live(a))
      else
        local stay, gone = {}, {}
        for _, m in ipairs(live(a + 1)) do stay[m] = true end
        for _, m in ipairs(live(a)) do if not stay[m] then gone[#gone + 1] = m end end
        group(a, gone)
      end
    end
    if cn > 0 then group(n, live(n)) end
  end
end
local snaps = {}
local lasts = n >= 1 and redis.call('SCARD', base .. 'snaplast') or 0
if lasts > 0 then
  local hits = {}  -- the query's positions where some snapshot ends, ascending
  if blob and lasts * 8 < n then
    for _, h in ipairs(redis.call('SMEMBERS', base .. 'snaplast')) do
      if #h == width then
        local at = string.find(blob, h, 1, true)
        while at and (at - 1) % width ~= 0 do at = string.find(blob, h, at + 1, true) end
        if at then hits[#hits + 1] = (at - 1) / width + 1 end
      end
    end
    table.sort(hits)
  else
    for i = 1, n do hash(i) end
    local flags = redis.call('SMISMEMBER', base .. 'snaplast', unpack(q, 1, n))
    for i = 1, n do if flags[i] == 1 then hits[#hits + 1] = i end end
  end
  local catalog = base .. 'snaps'
  for _, i in ipairs(hits) do
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', base .. 'snap:' .. hash(i), lo, '+inf')) do
      local raw = redis.call('HGET', catalog, id)
      if raw and tonumber(cjson.decode(raw).n_blocks) == i then snaps[#snaps + 1] = raw end
    end
  end
end
local own = ''
if conv ~= '' then
  local m = redis.call('GET', base .. 'conv:' .. conv)
  if m and redis.call('HGET', base .. 'slot:' .. m, 'conv') == conv then own = m end
end
-- A few bulk strings rather than hundreds of array items: the client parses them far faster.
local reply = {table.concat(snaps, '\\n'), own, table.concat(exact, '\\n')}
for i = 1, #groups do reply[i + 3] = groups[i] end
return reply
"""

# KEYS: the pod's set in one model -> how many live entries were removed
PURGE_POD = PRELUDE + """
local podkey = KEYS[1]
local now = now_ms()
local removed = 0
for _, e in ipairs(redis.call('SMEMBERS', podkey)) do
  local ref = cjson.decode(e)
  local kind, base, id = ref[1], ref[2], ref[3]
  if kind == 's' then
    local skey = base .. 'slot:' .. id
    local fields = redis.call('HMGET', skey, 'chain', 'w', 'blocks', 'deadline')
    untag(base, skey, id, '', '')
    if fields[4] then
      for _, h in ipairs(stored_chain(fields)) do redis.call('ZREM', base .. 'b:' .. h, id) end
      if tonumber(fields[4]) > now then removed = removed + 1 end
      redis.call('DEL', skey)
    end
  else
    local catalog = base .. 'snaps'
    local raw = redis.call('HGET', catalog, id)
    if raw then
      local snap = cjson.decode(raw)
      drop_snapshot(base, snap.last_block, id)
      redis.call('HDEL', catalog, id)
      if snap.deadline > now then removed = removed + 1 end
    end
  end
end
redis.call('DEL', podkey)
return removed
"""

# KEYS: heads key, points key; ARGV: ttl ms, max heads, max points, the head member, then the point members
# (newest first). Each list is a ZSET scored by time (now * 100, minus the member's place in this call,
# so one call's members keep their order): ZADD moves a member seen again to the front, and
# ZREMRANGEBYRANK keeps the newest. The points live as long as the family's latest head.
RECORD_HEAD = PRELUDE + """
local hkey, pkey, ttl = KEYS[1], KEYS[2], tonumber(ARGV[1])
local max_heads, max_points = tonumber(ARGV[2]), tonumber(ARGV[3])
local score = now_ms() * 100
redis.call('ZADD', hkey, score + 99, ARGV[4])
redis.call('ZREMRANGEBYRANK', hkey, 0, -(max_heads + 1))
redis.call('PEXPIRE', hkey, ttl)
for i = 5, #ARGV do redis.call('ZADD', pkey, score + 98 - (i - 5), ARGV[i]) end
if redis.call('EXISTS', pkey) == 1 then
  redis.call('ZREMRANGEBYRANK', pkey, 0, -(max_points + 1))
  redis.call('PEXPIRE', pkey, ttl)
end
return 1
"""

# KEYS: heads key, points key -> {heads newest first, points newest first}.
FAMILY = """
return {redis.call('ZREVRANGE', KEYS[1], 0, -1), redis.call('ZREVRANGE', KEYS[2], 0, -1)}
"""

# KEYS: the instance key; ARGV: a fresh token -> the key's value, set to the token first when missing
# (no TTL: it goes only with the rest of the data, when Redis restarts empty or is flushed).
INSTANCE = """
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""
