local epoch = redis.call('GET', KEYS[2])
if (not epoch) or redis.call('EXISTS', KEYS[1]) == 0 then
  epoch = ARGV[1]
  redis.call('SET', KEYS[2], epoch)
end
local ids = {}
for i = 3, #ARGV, 4 do
  if ARGV[i + 2] == '1' then
    ids[#ids + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '=', ARGV[2], '0-*', 'v', ARGV[i], 'h', ARGV[i + 1], 'k', ARGV[i + 3])
  else
    ids[#ids + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '=', ARGV[2], '0-*', 'v', ARGV[i], 'h', ARGV[i + 1])
  end
end
return {epoch, ids}
