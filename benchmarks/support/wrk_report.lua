-- wrk script: POSTs the body in WRK_BODY_FILE with the headers given in WRK_HEADERS
-- ("Name: value|Name: value"), and prints a JSON summary line at the end. Where the body holds
-- __SEQUENCE_ID__, each request puts a number there that no other request of the run has.
local body_file = os.getenv("WRK_BODY_FILE")
local headers = os.getenv("WRK_HEADERS") or ""

wrk.method = "POST"
if body_file then
  local f = assert(io.open(body_file, "rb"))
  wrk.body = f:read("*a")
  f:close()
end
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("first_id", threads * 1000000000)
end

if wrk.body and string.find(wrk.body, "__SEQUENCE_ID__", 1, true) then
  local template = wrk.body
  local sent = 0
  function request()
    sent = sent + 1
    local body = string.gsub(template, "__SEQUENCE_ID__", tostring(first_id + sent))
    return wrk.format(nil, nil, nil, body)
  end
end

for pair in string.gmatch(headers, "[^|]+") do
  local name, value = string.match(pair, "^%s*(.-)%s*:%s*(.-)%s*$")
  if name then wrk.headers[name] = value end
end

function done(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.status + summary.errors.timeout
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "errors": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, errors,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
