-- wrk script for `fanout bench http`: authenticated Matrix sends with a unique txnId per request.
-- FANOUT_TOKEN: an access token; FANOUT_PATHS: comma-separated "/_matrix/client/v3/rooms/<room>"
-- prefixes, spread over round robin. Each wrk thread has its own Lua state, so txnIds carry the
-- thread's number to stay unique across threads.
local token = os.getenv("FANOUT_TOKEN")
local paths = {}
for p in string.gmatch(os.getenv("FANOUT_PATHS") or "", "[^,]+") do
  paths[#paths + 1] = p
end
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

local counter = 0
local body = '{"msgtype":"m.text","body":"hello from wrk"}'
local headers = {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}

function request()
  counter = counter + 1
  local prefix = paths[(counter % #paths) + 1]
  return wrk.format("PUT", prefix .. "/send/m.room.message/wrk" .. tid .. "-" .. counter, headers, body)
end
