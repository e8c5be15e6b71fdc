-- Heartbeats from a list of hosts, paced to a rate, for wrk 4 (bench/fleet_pulse.py).
--
-- Each wrk thread talks to one scheduler replica and beats its own hosts in turn, as
-- hostd does (POST /v1/hosts/{name}/heartbeat, no body, the host token): the same
-- request bench/fleet_pulse.py's Python beat() sends. wrk 4 has no -R (that is wrk2),
-- so the pace is kept here: before every request wrk asks delay() how long this
-- connection should wait, and delay() hands out the thread's send slots in order, slot
-- k due at k / rate after the thread's first request. While a connection is free when
-- its slot comes, beats go out on time (to the timer's millisecond); when every
-- connection is still waiting for an answer, the next slot is already past when one
-- frees up, and the beat goes out late. Those are counted (late_1ms, late_10ms,
-- late_100ms, max_late_us), because wrk's latency runs from the moment a request is
-- written, not from when it was due: with no late sends the two are the same; with
-- many, wrk's percentiles leave the waiting out (coordinated omission) and the late
-- counts say how much.
--
-- Configured by the environment (wrk runs setup() where its "--" arguments are not
-- visible), one value per thread where a list is given, separated by commas:
--   HYB_WRK_ADDRS  host:port of each thread's replica (wrk -t must equal their number)
--   HYB_WRK_NAMES  a file per thread, one host name a line
--   HYB_WRK_RATE   beats per second per thread
--   HYB_WRK_COUNT  beats per thread; after them the thread idles until wrk's -d ends
--   HYB_WRK_START  index in each thread's list of the first host to beat
--   HYB_WRK_TOKEN  the bearer token
-- done() prints one line, "HYB-WRK-REPORT " and a JSON object (tools/dev/schedbench.py
-- parse_wrk_report reads it). A test: tests/bench/test_wrk_heartbeat.py.

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } hyb_timespec;
int clock_gettime(int clk_id, hyb_timespec *tp);
]]
local CLOCK_MONOTONIC = 1 -- the clock Python's time.monotonic() reads
local ts = ffi.new("hyb_timespec")

local function now_us()
   ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
   return tonumber(ts.tv_sec) * 1e6 + tonumber(ts.tv_nsec) / 1e3
end

local function split(s)
   local out = {}
   for item in string.gmatch(s or "", "[^,]+") do
      out[#out + 1] = item
   end
   return out
end

-- setup and done: the main Lua state

local threads = {}

function setup(thread)
   local i = #threads + 1
   local addrs = split(os.getenv("HYB_WRK_ADDRS"))
   local host, port = string.match(addrs[i], "^(.+):(%d+)$")
   thread.addr = wrk.lookup(host, port)[1]
   thread:set("id", i)
   thread:set("hostport", addrs[i])
   threads[i] = thread
end

-- the running phase: one Lua state per thread

function init(args)
   local names_file = split(os.getenv("HYB_WRK_NAMES"))[id]
   rate = tonumber(os.getenv("HYB_WRK_RATE"))
   count = tonumber(os.getenv("HYB_WRK_COUNT"))
   local start = tonumber(os.getenv("HYB_WRK_START") or "0")
   local headers = { ["Host"] = hostport, ["Authorization"] = "Bearer " .. os.getenv("HYB_WRK_TOKEN") }
   reqs = {}
   for name in io.lines(names_file) do
      -- a body of "" so wrk writes Content-Length: 0, as the Python client does
      reqs[#reqs + 1] = wrk.format("POST", "/v1/hosts/" .. name .. "/heartbeat", headers, "")
   end
   next_req = start % #reqs
   slot, t0 = 0, nil
   sent, late_1ms, late_10ms, late_100ms, max_late_us = 0, 0, 0, 0, 0
   first_send_us, last_send_us, last_answer_us = 0, 0, 0
   statuses = {} -- status code (as a string: get()/set() carry flat tables) -> answers
end

function delay()
   local now = now_us()
   if t0 == nil then
      t0 = now
      first_send_us = now
   end
   if slot >= count then
      return 3600 * 1000 -- this thread's beats are out: idle until -d ends
   end
   local due = t0 + slot * 1e6 / rate
   slot = slot + 1
   local wait = due - now
   if wait > 0 then
      return math.ceil(wait / 1000) -- never early; up to 1 ms late (the timer's unit)
   end
   local late = -wait
   if late > 1000 then late_1ms = late_1ms + 1 end
   if late > 10000 then late_10ms = late_10ms + 1 end
   if late > 100000 then late_100ms = late_100ms + 1 end
   if late > max_late_us then max_late_us = late end
   return 0
end

function request()
   if t0 == nil then
      return reqs[1] -- wrk's own check of the script (before any delay()), not a beat
   end
   local r = reqs[next_req + 1]
   next_req = (next_req + 1) % #reqs
   sent = sent + 1
   last_send_us = now_us()
   return r
end

function response(status, headers, body)
   local k = tostring(status)
   statuses[k] = (statuses[k] or 0) + 1
   last_answer_us = now_us()
end

-- done: the main state again, reading each thread's globals

function done(summary, latency, requests)
   local out = {
      threads = #threads, duration_us = summary.duration, answered = summary.requests,
      errors = summary.errors, latency_us = {}, statuses = {}, sent = 0,
      late_1ms = 0, late_10ms = 0, late_100ms = 0, max_late_us = 0,
      first_send_us = nil, last_send_us = 0, last_answer_us = 0,
   }
   for _, p in ipairs({ 50, 90, 99, 99.9 }) do
      out.latency_us[tostring(p)] = latency:percentile(p)
   end
   out.latency_us["max"] = latency.max
   for _, t in ipairs(threads) do
      out.sent = out.sent + t:get("sent")
      for _, k in ipairs({ "late_1ms", "late_10ms", "late_100ms" }) do
         out[k] = out[k] + t:get(k)
      end
      out.max_late_us = math.max(out.max_late_us, t:get("max_late_us"))
      local f = t:get("first_send_us")
      if f > 0 and (out.first_send_us == nil or f < out.first_send_us) then out.first_send_us = f end
      out.last_send_us = math.max(out.last_send_us, t:get("last_send_us"))
      out.last_answer_us = math.max(out.last_answer_us, t:get("last_answer_us"))
      for k, n in pairs(t:get("statuses")) do
         out.statuses[k] = (out.statuses[k] or 0) + n
      end
   end
   io.write("HYB-WRK-REPORT ", json(out), "\n")
end

-- the smallest JSON writer for the report above: numbers, strings, flat or nested tables
-- with string keys (wrk has no JSON library)
function json(v)
   local t = type(v)
   if t == "table" then
      local parts = {}
      for k, x in pairs(v) do
         parts[#parts + 1] = string.format("%q:%s", tostring(k), json(x))
      end
      return "{" .. table.concat(parts, ",") .. "}"
   elseif t == "number" then
      if v ~= v or v == math.huge or v == -math.huge then return "null" end
      return string.format("%.17g", v)
   elseif t == "string" then
      return string.format("%q", v)
   elseif t == "nil" then
      return "null"
   end
   return tostring(v)
end
