#!/usr/bin/env bash
# The slot map in etcd (replicas 1 with a coordinator): published by the first server as the
# static map of the spec, read by the others and by clients; `psctl slots` (text and JSON);
# `ps-server --join` registers a new server owning no slot (again at a restart: same index);
# the join's usage errors exit 2 with a message naming the problem; a map of another cluster or
# of another slot count, or a malformed one, is refused at start; a client opens on the static
# map while etcd is down. Skipped (77) without etcd.
# Usage: test_slots_cli.sh PS_SERVER PSCTL PSCTL_PUSH
set -u
bin=$1 psctl=$2 push=$3
fail=0
# shellcheck source=../support/cli_etcd.sh
. "$(dirname "$0")/../support/cli_etcd.sh"
two='{"ps":["127.0.0.1:1","127.0.0.1:2"]}'
check join-no-coordinator 2 "join: set coordinator" "$bin" --cluster "$two" --join --listen tcp://127.0.0.1:3
check join-no-listen 2 "join: set listen" "$bin" --cluster "$two" --join --coordinator http://127.0.0.1:1
check join-with-task 2 "has no task" "$bin" --cluster "$two" --task ps:0 --join --listen tcp://127.0.0.1:3 --coordinator http://127.0.0.1:1
check join-replicas 2 "replicas > 1 cannot grow yet" "$bin" --cluster "$two" --join --listen tcp://127.0.0.1:3 --coordinator http://127.0.0.1:1 --replicas 2
check join-wildcard 2 "wildcard host" "$bin" --cluster "$two" --join --listen tcp://0.0.0.0:3 --coordinator http://127.0.0.1:1
check psctl-slots-no-coordinator 2 "the slot map lives there" "$psctl" --cluster "$two" slots

etcd_setup slots-cli

p0=$(port); p1=$(port); p2=$(port)
spec="{\"ps\":[\"127.0.0.1:$p0\",\"127.0.0.1:$p1\"]}"
check psctl-slots-none 1 "no slot map under" "$psctl" --cluster "$spec" --coordinator "$coord" slots
h0=$(port); h2=$(port)
"$bin" --cluster "$spec" --task ps:0 --coordinator "$coord" --http-listen 127.0.0.1:$h0 2>"$tmp/ps0.log" &
pids+=($!)
"$bin" --cluster "$spec" --task ps:1 --coordinator "$coord" 2>"$tmp/ps1.log" &
pids+=($!)
if wait_log "$tmp/ps0.log" "serving on" 15 && wait_log "$tmp/ps1.log" "serving on" 5 &&
   [ "$(cat "$tmp"/ps0.log "$tmp"/ps1.log | grep -c 'published the static slot map')" -eq 1 ]; then
  echo "ok   one server published the map, both serve"
else
  echo "FAIL start"; cat "$tmp/ps0.log" "$tmp/ps1.log"; fail=1
fi
check psctl-slots 0 "slot map version 1: 4096 slots over 2 servers" "$psctl" --cluster "$spec" --coordinator "$coord" slots
# A client reads the map at open and places by it (the static one here).
if TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" "$push" v1 >"$tmp/push.log" 2>&1; then
  echo "ok   client with the coordinator pushes"
else
  echo "FAIL client push: $(cat "$tmp/push.log")"; fail=1
fi

# A server joins: appended to the map, owning nothing.
"$bin" --cluster "$spec" --join --listen "tcp://127.0.0.1:$p2" --coordinator "$coord" --http-listen 127.0.0.1:$h2 2>"$tmp/ps2.log" &
pid2=$!; pids+=($pid2)
if wait_log "$tmp/ps2.log" "serving on" 15 && grep -q "registered 127.0.0.1:$p2 as server 2 of the slot map (version 2)" "$tmp/ps2.log"; then
  echo "ok   join registers"
else
  echo "FAIL join"; cat "$tmp/ps2.log"; fail=1
fi
map=$("$psctl" --cluster "$spec" --coordinator "$coord" --json slots)
if /usr/bin/python3 -c '
import json, sys
m = json.loads(sys.argv[1])
assert m["version"] == 2 and m["slots"] == 4096, m
assert [s["slots"] for s in m["servers"]] == [2048, 2048, 0], m
assert [s["task"] for s in m["servers"]] == [0, 1, 2], m
assert m["servers"][2]["address"] == "127.0.0.1:'$p2'" and m["servers"][2]["joined"], m
assert m["moves"] == [] and m["split_servers"] == 2, m
 ' "$map"; then echo "ok   psctl slots --json"; else echo "FAIL psctl slots --json: $map"; fail=1; fi
metric() { /usr/bin/python3 -c 'import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "http://127.0.0.1:$1/metrics" | grep "^$2 "; }
if [ "$(metric $h0 psd_slots_owned)" = "psd_slots_owned 2048" ] && [ "$(metric $h2 psd_slots_owned)" = "psd_slots_owned 0" ]; then
  echo "ok   psd_slots_owned"
else
  echo "FAIL psd_slots_owned: $(metric $h0 psd_slots_owned) / $(metric $h2 psd_slots_owned)"; fail=1
fi
# A restart of the joined server finds itself in the map: same index, no new version.
kill -9 $pid2; wait $pid2 2>/dev/null
"$bin" --cluster "$spec" --join --listen "tcp://127.0.0.1:$p2" --coordinator "$coord" 2>"$tmp/ps2b.log" &
pids+=($!)
if wait_log "$tmp/ps2b.log" "serving on" 15 && grep -q "is server 2 of the slot map already (version 2)" "$tmp/ps2b.log"; then
  echo "ok   rejoin keeps its index"
else
  echo "FAIL rejoin"; cat "$tmp/ps2b.log"; fail=1
fi
# The clients still place by the map (nothing moved to the joined server).
if TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" "$push" v2 >"$tmp/push2.log" 2>&1; then
  echo "ok   client push after the join"
else
  echo "FAIL client push after the join: $(cat "$tmp/push2.log")"; fail=1
fi
check join-spec-address 2 "is ps 0 of the cluster spec" "$bin" --cluster "$spec" --join --listen "tcp://127.0.0.1:$p0" --coordinator "$coord"
# Another cluster at the same prefix: refused at start.
prefix=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["prefix"])' "$map")
p3=$(port)
[ -n "$prefix" ] && check other-cluster 2 "another cluster uses coordinator-prefix" "$bin" --cluster "{\"ps\":[\"127.0.0.1:$p3\"]}" --task ps:0 --coordinator "$coord" --coordinator-prefix "$prefix"
check join-nothing 2 "no slot map under /elsewhere" "$bin" --cluster "$spec" --join --listen "tcp://127.0.0.1:$p3" --coordinator "$coord" --coordinator-prefix /elsewhere
# Another slot count (a map written by another release): refused at start.
/usr/bin/python3 - "$coord" <<'PY'
import base64, json, sys, urllib.request
v = json.dumps({"version": 1, "slots": 1024, "base": 1, "servers": ["127.0.0.1:9"], "moved": []})
b = lambda s: base64.b64encode(s.encode()).decode()
urllib.request.urlopen(sys.argv[1] + "/v3/kv/put", json.dumps({"key": b("/other/slots"), "value": b(v)}).encode(), timeout=5)
urllib.request.urlopen(sys.argv[1] + "/v3/kv/put", json.dumps({"key": b("/bad/slots"), "value": b("{\"version\":1}")}).encode(), timeout=5)
PY
check malformed-map 2 "/bad/slots in etcd .*is missing or not a power of two" "$bin" --cluster '{"ps":["127.0.0.1:9"]}' --task ps:0 --coordinator "$coord" --coordinator-prefix /bad
check other-slot-count 2 "the slot count differs between servers" "$bin" --cluster '{"ps":["127.0.0.1:9"]}' --task ps:0 --coordinator "$coord" --coordinator-prefix /other
# etcd down: a client opens on the static map (the servers check every owner) and says so.
kill -9 $etcd_pid
if TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" "$push" v3 >"$tmp/push3.log" 2>&1 &&
   grep -q "placing by the static map" "$tmp/push3.log"; then
  echo "ok   client with etcd down"
else
  echo "FAIL client with etcd down: $(cat "$tmp/push3.log")"; fail=1
fi
exit $fail
