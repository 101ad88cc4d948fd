if redis.call('EXISTS', KEYS[1]) == 0 then return {false} end
local epoch = redis.call('GET', KEYS[2])
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local f = {}
for i = 1, #info, 2 do f[info[i]] = info[i + 1] end
local first = false
if f['first-entry'] then first = f['first-entry'][1] end
local entries = {}
if tonumber(ARGV[2]) > 0 then
  entries = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
end
return {epoch, f['last-generated-id'], f['max-deleted-entry-id'] or '0-0', first, entries}
