-- wrk script for the object server's test: random objects (some missing)
-- and random ranges (some past the end); every response's status is
-- counted, and its body is checked against the test pattern at sampled
-- offsets (the object and its first offset come from ETag and
-- Content-Range). done() prints one line of counts that the test parses.
--
-- Pattern: byte i of object n is (i*7 + n*31 + floor(i/4096)) % 251.
-- Environment: OBJECTS (objects 0..OBJECTS-1 exist), SIZE (their size).

local objects = tonumber(os.getenv("OBJECTS") or "16")
local size = tonumber(os.getenv("SIZE") or "1048576")
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  ok, bad, s200, s206, s404, s416, other, checked = 0, 0, 0, 0, 0, 0, 0, 0
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
end

function request()
  local n = math.random(0, objects) -- objects itself is missing
  local r = math.random(1, 5)
  local headers = {}
  if r == 1 then
    local a = math.random(0, size - 1)
    headers["Range"] = "bytes=" .. a .. "-" .. (a + math.random(0, 300000))
  elseif r == 2 then
    headers["Range"] = "bytes=-" .. math.random(1, 200000)
  elseif r == 3 then
    headers["Range"] = "bytes=" .. (size + math.random(0, 1000)) .. "-" -- past the end
  end
  return wrk.format("GET", "/obj/" .. n, headers)
end

local function expected(n, i)
  return (i * 7 + n * 31 + math.floor(i / 4096)) % 251
end

function response(status, headers, body)
  if status == 200 then s200 = s200 + 1
  elseif status == 206 then s206 = s206 + 1
  elseif status == 404 then s404 = s404 + 1; return
  elseif status == 416 then s416 = s416 + 1; return
  else other = other + 1; return end
  local etag = headers["ETag"] or headers["etag"] or ""
  local n, total = etag:match('"(%d+)%-(%d+)"')
  if n == nil then bad = bad + 1; return end
  n, total = tonumber(n), tonumber(total)
  local first, last = 0, total - 1
  local cr = headers["Content-Range"] or headers["content-range"]
  if status == 206 then
    if cr == nil then bad = bad + 1; return end
    first, last = cr:match("bytes (%d+)%-(%d+)/")
    first, last = tonumber(first), tonumber(last)
  end
  if #body ~= last - first + 1 then bad = bad + 1; return end
  local step = math.max(1, math.floor(#body / 64))
  for k = 1, #body, step do
    if body:byte(k) ~= expected(n, first + k - 1) then bad = bad + 1; return end
    checked = checked + 1
  end
  if body:byte(#body) ~= expected(n, last) then bad = bad + 1; return end
  ok = ok + 1
end

function done(summary, latency, requests)
  local t = { ok = 0, bad = 0, s200 = 0, s206 = 0, s404 = 0, s416 = 0, other = 0, checked = 0 }
  for _, th in ipairs(threads) do
    for k, _ in pairs(t) do t[k] = t[k] + (th:get(k) or 0) end
  end
  local e = summary.errors
  io.write(string.format(
    "RESULT ok=%d bad=%d s200=%d s206=%d s404=%d s416=%d other=%d checked=%d connect=%d read=%d write=%d timeout=%d requests=%d\n",
    t.ok, t.bad, t.s200, t.s206, t.s404, t.s416, t.other, t.checked,
    e.connect, e.read, e.write, e.timeout, summary.requests))
end
