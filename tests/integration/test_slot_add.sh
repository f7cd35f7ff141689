#!/usr/bin/env bash
# psctl add-server: a server started with --join gets an even share of the slots while 2 client
# threads, opened before it joined, push to variables held whole and to table rows, and 2 more
# send the same updates as Steps (ps_step_ex, as worker 0: each Step moves its clock, which
# with its heartbeats reaches the new server too): the clients learn the new server from the map and
# connect to it (a Step refused as moved is cut by owner and resent), and every value then
# equals the sum of the pushes acknowledged. A variable of 3 * 2^18 + 5 floats cut in parts
# (split-parts) is pushed whole now and then by both: its parts move with their slots and it
# comes out exact too. Skipped (77) without etcd.
# Usage: test_slot_add.sh PS_SERVER PSCTL SLOT_MOVE_PUSHER
set -u
bin=$1 psctl=$2 pusher=$3
fail=0
# shellcheck source=../support/cli_etcd.sh
. "$(dirname "$0")/../support/cli_etcd.sh"
etcd_setup slot-add

a=(); for i in 0 1 2; do a+=("127.0.0.1:$(port)"); done
spec="{\"ps\":[\"${a[0]}\",\"${a[1]}\"]}"
pfx=/psd-slot-add
for i in 0 1; do
  "$bin" --cluster "$spec" --task ps:$i --coordinator "$coord" --coordinator-prefix $pfx 2>>"$tmp/ps$i.log" &
  pids+=($!)
done
for i in 0 1; do
  wait_log "$tmp/ps$i.log" "serving on" 15 || { echo "FAIL ps$i did not start"; cat "$tmp/ps$i.log"; exit 1; }
done
ctl=("$psctl" --cluster "$spec" --coordinator "$coord" --coordinator-prefix $pfx)
check not-joined 2 "start it with ps-server --join first" "${ctl[@]}" add-server "${a[2]}"

export TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" PS_COORDINATOR_PREFIX=$pfx
export PS_RETRIES=100 PS_DEADLINE_MS=60000 PS_SPLIT_PARTS=true
"$pusher" push "$tmp/hist" "$tmp/stop" >"$tmp/push.log" 2>&1 &
pusher_pid=$!; pids+=($pusher_pid)
PS_WORKER_ID=0 PS_HEARTBEAT_MS=200 "$pusher" step "$tmp/hist2" "$tmp/stop" >"$tmp/step.log" 2>&1 &
stepper_pid=$!; pids+=($stepper_pid)
"$bin" --cluster "$spec" --join --listen "tcp://${a[2]}" --coordinator "$coord" \
  --coordinator-prefix $pfx 2>>"$tmp/ps2.log" &
pids+=($!)
wait_log "$tmp/ps2.log" "serving on" 15 || { echo "FAIL the joining server did not start"; cat "$tmp/ps2.log"; exit 1; }
sleep 1
check add-server 0 "add-server: done" "${ctl[@]}" --batch-slots 128 add-server "${a[2]}"
check even 0 "${a[2]} *136[45]" "${ctl[@]}" slots
# Parts of "big/w" (slots 42, 4086, 835, 4029: proto/README.md's known answers) the map now
# gives the joined server (task 2): add-server's plan moves slots 0..1365 to it, so parts 0
# (from ps 0) and 2 (from ps 1).
moved_parts=$(/usr/bin/python3 -c 'import urllib.request,sys,base64,json
r = json.load(urllib.request.urlopen(sys.argv[1] + "/v3/kv/range", json.dumps({"key": base64.b64encode(sys.argv[2].encode()).decode()}).encode(), timeout=3))
m = json.loads(base64.b64decode(r["kvs"][0]["value"]))
moved = {s: o for s, o in m["moved"]}
print(sum(moved.get(s, s % m["base"]) == 2 for s in (42, 4086, 835, 4029)))' "$coord" "$pfx/slots")
if [ "${moved_parts:-0}" -ge 1 ]; then echo "ok   big/w: $moved_parts of its 4 parts moved to the joined server"
else echo "FAIL big/w: none of its parts moved to the joined server (${moved_parts:-no map})"; fail=1; fi
sleep 1
touch "$tmp/stop"
if wait $pusher_pid; then echo "ok   pushers: $(grep -c 'joined the cluster' "$tmp/push.log") connection(s) to the new server, $(tail -1 "$tmp/push.log")"
else echo "FAIL pushers:"; cat "$tmp/push.log"; fail=1; fi
if wait $stepper_pid; then echo "ok   steps: $(tail -1 "$tmp/step.log")"
else echo "FAIL steps:"; cat "$tmp/step.log"; fail=1; fi
check exact 0 "equals its acknowledged pushes" "$pusher" check "$tmp/hist" "$tmp/hist2"
grep -q '"big/w" (4 parts) equals its [1-9]' <<<"$out" || { echo "FAIL big/w: $out"; fail=1; }
[ $fail -eq 0 ] || { for i in 0 1 2; do echo "--- ps$i"; tail -20 "$tmp/ps$i.log"; done; }
exit $fail
