"""Lua scripts of the Redis index's snapshot records: recorded, forgotten, listed.

Apart from the slot scripts (`redis_lua`), whose prelude they share: a snapshot record is one catalog
field plus a member of its last block's set, and none of the slot lookup's machinery.
"""

from __future__ import annotations

from llamafleet_core.index.redis_lua import PRELUDE

# KEYS: base, the pod's set in this model; ARGV: snapshot id, ttl ms, snapshot json (no deadline), last block
RECORD_SNAPSHOT = PRELUDE + """
local base, podkey, id, ttl, payload, last = KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local now = now_ms()
local deadline = now + ttl
local catalog = base .. 'snaps'
local old = redis.call('HGET', catalog, id)
if old then
  local prev = cjson.decode(old).last_block
  if prev ~= last then drop_snapshot(base, prev, id) end
end
local snap = cjson.decode(payload)
snap.deadline = deadline
redis.call('HSET', catalog, id, cjson.encode(snap))
extend(catalog, ttl)
add_member(base .. 'snap:' .. last, deadline, id, now, ttl)
redis.call('SADD', base .. 'snaplast', last)
extend(base .. 'snaplast', ttl)
redis.call('SADD', podkey, cjson.encode({'n', base, id}))
extend(podkey, ttl)
return 1
"""

# KEYS: base, the pod's set in this model; ARGV: snapshot id
FORGET_SNAPSHOT = PRELUDE + """
local base, podkey, id = KEYS[1], KEYS[2], ARGV[1]
local catalog = base .. 'snaps'
local old = redis.call('HGET', catalog, id)
if old then
  drop_snapshot(base, cjson.decode(old).last_block, id)
  redis.call('HDEL', catalog, id)
end
redis.call('SREM', podkey, cjson.encode({'n', base, id}))
return old and 1 or 0
"""

# KEYS: base -> live snapshot payloads; expired ones are deleted on the way (the catalog is one hash
# whose fields cannot expire on their own in Redis 7.0).
SNAPSHOTS = PRELUDE + """
local catalog = KEYS[1] .. 'snaps'
local now = now_ms()
local live = {}
local all = redis.call('HGETALL', catalog)
for i = 1, #all, 2 do
  if cjson.decode(all[i + 1]).deadline > now then live[#live + 1] = all[i + 1]
  else redis.call('HDEL', catalog, all[i]) end
end
return live
"""
