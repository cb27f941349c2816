-- wrk script for benchmarks/features/response_cache.py: every request POSTs a v2 JSON body for the add
-- model whose first value is a fresh number and whose second is WRK_RUN_ID (one per wrk run),
-- so no two requests share a cache key, in one run or across runs (0% hits).
-- Prints the same JSON summary line as wrk_report.lua.
local counter = 0
local run_id = tonumber(os.getenv("WRK_RUN_ID") or "0")
local template = '{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[%d,%d,3,4]},'
  .. '{"name":"INPUT1","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}'
local headers = {["Content-Type"] = "application/json"}

request = function()
  counter = counter + 1
  return wrk.format("POST", nil, headers, string.format(template, counter, run_id))
end

function done(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.status + summary.errors.timeout
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "errors": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, errors,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
