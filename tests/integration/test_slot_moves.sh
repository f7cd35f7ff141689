#!/usr/bin/env bash
# Slots moved between live servers (replicas 1 with a coordinator): psctl's usage errors exit 2
# with a named reason and move nothing; `psctl remove-server` empties one of three servers
# while 2 client threads push to variables held whole and to table rows, and every value then
# equals the sum of the pushes acknowledged (none applied twice, none lost), and rebalance
# leaves it empty; `psctl add-server` of it again, killed (-9) mid-batch, rolls the batch back
# (exit 1, the map unchanged) and again nothing is lost or doubled. Skipped (77) without etcd.
# Usage: test_slot_moves.sh PS_SERVER PSCTL SLOT_MOVE_PUSHER
set -u
bin=$1 psctl=$2 pusher=$3
fail=0
# shellcheck source=../support/cli_etcd.sh
. "$(dirname "$0")/../support/cli_etcd.sh"
three='{"ps":["127.0.0.1:1","127.0.0.1:2","127.0.0.1:3"]}'
check no-coordinator 2 "set coordinator" "$psctl" --cluster "$three" remove-server 127.0.0.1:3
check replicas 2 "replicas 1 only" "$psctl" --cluster "$three" --coordinator http://127.0.0.1:1 --replicas 2 rebalance
check no-address 2 "remove-server needs the HOST:PORT" "$psctl" --cluster "$three" --coordinator http://127.0.0.1:1 remove-server
check batch-zero 2 "batch-slots needs" "$psctl" --cluster "$three" --batch-slots 0 rebalance
check batch-elsewhere 2 "apply to add-server" "$psctl" --cluster "$three" --batch-slots 4 slots

etcd_setup slot-moves

a=(); for i in 0 1 2; do a+=("127.0.0.1:$(port)"); done
spec="{\"ps\":[\"${a[0]}\",\"${a[1]}\",\"${a[2]}\"]}"
pfx=/psd-slot-moves
h0=$(port)
start() { # task
  local http=(); [ "$1" = 0 ] && http=(--http-listen 127.0.0.1:$h0)
  "$bin" --cluster "$spec" --task ps:$1 --coordinator "$coord" --coordinator-prefix $pfx \
    "${http[@]}" 2>>"$tmp/ps$1.log" &
  pids+=($!); eval "ps$1_pid=$!"
}
for i in 0 1 2; do start $i; done
for i in 0 1 2; do
  wait_log "$tmp/ps$i.log" "serving on" 15 || { echo "FAIL ps$i did not start"; cat "$tmp/ps$i.log"; exit 1; }
done
ctl=("$psctl" --cluster "$spec" --coordinator "$coord" --coordinator-prefix $pfx)
check unknown-address 2 "is not a server of the slot map" "${ctl[@]}" remove-server 127.0.0.1:9
etcd_put "$pfx/moves/current" "id=x from=0 to=1 updated_ms=$(( $(date +%s) * 1000 )) slots=4"
check move-running 2 "a move is already running" "${ctl[@]}" rebalance
etcd_del "$pfx/moves/current"
check nothing-to-do 0 "nothing to move" "${ctl[@]}" rebalance

export TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" PS_COORDINATOR_PREFIX=$pfx
export PS_RETRIES=100 PS_DEADLINE_MS=60000
run_pushers() { # name: pushes until $tmp/stop-name, history in $tmp/hist-name
  "$pusher" push "$tmp/hist-$1" "$tmp/stop-$1" >"$tmp/push-$1.log" 2>&1 &
  pusher_pid=$!; pids+=($pusher_pid)
}
hists=()
end_pushers() { # name (the check sums every run's history: the runs push the same variables)
  touch "$tmp/stop-$1"
  hists+=("$tmp/hist-$1")
  if wait $pusher_pid; then echo "ok   pushers ($1): $(cat "$tmp/push-$1.log")"
  else echo "FAIL pushers ($1):"; cat "$tmp/push-$1.log"; fail=1; fi
  check "exact-$1" 0 "equals its acknowledged pushes" "$pusher" check "${hists[@]}"
}

# remove-server while pushing.
run_pushers remove
sleep 1
check remove-server 0 "remove-server: done" "${ctl[@]}" --batch-slots 128 remove-server "${a[2]}"
# A batch's size, for a cap that makes the next one take about 4 s.
bytes=$(grep -m1 -o '[0-9]* bytes, map version' <<<"$out" | cut -d' ' -f1)
sleep 1
end_pushers remove
check emptied 0 "${a[2]} *0\$" "${ctl[@]}" slots

check rebalance-keeps-it-out 0 "nothing to move" "${ctl[@]}" rebalance
# add-server ps2 back, killed mid-batch: rolled back, nothing lost or doubled.
before=$("${ctl[@]}" slots | head -1)
run_pushers kill
sleep 1
"${ctl[@]}" --batch-slots 128 --max-bytes-per-second $(( ${bytes:-4000} / 4 + 1 )) add-server "${a[2]}" >"$tmp/rebalance.log" 2>&1 &
rb_pid=$!
sleep 1.5
kill -9 "$ps2_pid"
if wait $rb_pid; then echo "FAIL add-server with its target killed exited 0"; cat "$tmp/rebalance.log"; fail=1
else echo "ok   add-server with its target killed failed: $(grep -m1 'rolled back' "$tmp/rebalance.log")"; fi
# ps2 back (empty: it owned no slot), so that the check's client opens on every server.
start 2
wait_log "$tmp/ps2.log" "serving on" 15 || echo "FAIL ps2 did not restart"
end_pushers kill
metrics=$(/usr/bin/python3 -c 'import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "http://127.0.0.1:$h0/metrics")
if grep -q '^psd_slot_moves_total{result="failed"} 1' <<<"$metrics" &&
   grep -q '^psd_slot_moves_total{result="started"} 1' <<<"$metrics"; then
  echo "ok   metrics: the source counted the batch started and failed"
else
  echo "FAIL metrics: $(grep psd_slot <<<"$metrics")"; fail=1
fi
after=$("${ctl[@]}" slots | head -1)
if [ "$before" = "$after" ]; then echo "ok   map unchanged: $after"
else echo "FAIL map changed: $before -> $after"; fail=1; fi
[ $fail -eq 0 ] || { for i in 0 1 2; do echo "--- ps$i"; tail -20 "$tmp/ps$i.log"; done; }
exit $fail
