-- wrk script for `cargo xtask bench service`: 64 KiB ranges of random
-- objects; done() prints one line with the latency percentiles (ms), the
-- request and byte counts and the errors, which the bench parses.
-- Environment: OBJECTS (objects 0..OBJECTS-1), SIZE (their size), CHUNK.

local objects = tonumber(os.getenv("OBJECTS") or "64")
local size = tonumber(os.getenv("SIZE") or "1048576")
local chunk = tonumber(os.getenv("CHUNK") or "65536")
local per_object = math.floor(size / chunk)

function init(args)
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
end

function request()
  local n = math.random(0, objects - 1)
  local a = math.random(0, per_object - 1) * chunk
  return wrk.format("GET", "/obj/" .. n, { Range = "bytes=" .. a .. "-" .. (a + chunk - 1) })
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT p50_ms=%.3f p99_ms=%.3f p999_ms=%.3f requests=%d bytes=%d duration_s=%.3f non2xx=%d connect=%d read=%d write=%d timeout=%d\n",
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency:percentile(99.9) / 1000,
    summary.requests, summary.bytes, summary.duration / 1e6,
    e.status, e.connect, e.read, e.write, e.timeout))
end
