-- wrk script for the inventory function. The route to load comes from
-- $ROUTE; done() prints one machine-readable RESULT line.
local route = os.getenv("ROUTE") or "floor"

request = function()
  local n = math.random(1, 1000000)
  if route == "floor" then
    -- No route matches: instantiate, parse, 404. No coord call.
    return wrk.format("GET", "/nowhere")
  elseif route == "read" then
    -- One store read of the item's record.
    return wrk.format("GET", "/items/item" .. (n % 1000))
  elseif route == "adjust" then
    -- Lock, fenced compare-and-set, release, on the function's 1 000 items
    -- (records::MAX_ITEMS: a new item beyond them is refused with 409, and
    -- each new item costs a listing of the table).
    return wrk.format("POST", "/items/item" .. (n % 1000) .. "/adjust?delta=1")
  elseif route == "export" then
    -- A rate-limit check per user, then the (empty) record list.
    return wrk.format("POST", "/exports", { ["x-user-id"] = "user" .. n })
  elseif route == "presence" then
    -- An ephemeral upsert.
    return wrk.format("PUT", "/items/item" .. (n % 1000) .. "/editors/s" .. n,
      { ["content-type"] = "application/json" }, '{"userId":"u"}')
  end
  error("unknown ROUTE " .. route)
end

done = function(summary, latency, requests)
  local seconds = summary.duration / 1e6
  io.write(string.format("RESULT %s %d %.0f %.2f %.2f %d\n", route, summary.requests,
    summary.requests / seconds, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.status + summary.errors.connect + summary.errors.read
      + summary.errors.write + summary.errors.timeout))
end
