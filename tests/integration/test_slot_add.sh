#!/usr/bin/env bash
# psctl add-server: a server started with --join gets an even share of the slots while 2 client
# threads, opened before it joined, push to variables held whole and to table rows, and 2 more
# send the same updates as Steps (ps_step_ex, as worker 0: each Step moves its clock, which
# with its heartbeats reaches the new server too): the clients learn the new server from the map and
# connect to it (a Step refused as moved is cut by owner and resent), and every value then
# equals the sum of the pushes acknowledged. Skipped (77) without etcd.
# Usage: test_slot_add.sh PS_SERVER PSCTL SLOT_MOVE_PUSHER
set -u
bin=$1 psctl=$2 pusher=$3
fail=0
check() { # name expected-exit expected-text command...
  local name=$1 want=$2 text=$3; shift 3
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -q -- "$text" <<<"$out"; then
    echo "FAIL $name: exit $rc (want $want), output: $out"; fail=1
  else
    echo "ok   $name"
  fi
}
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
etcd=${PSD_ETCD:-/usr/bin/etcd}
if [ ! -x "$etcd" ]; then
  echo "SKIP the rest: no etcd at $etcd (install Debian's etcd-server)"
  [ $fail -eq 0 ] && exit 77
  exit $fail
fi

tmp=$(mktemp -d /tmp/psd-slot-add-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp" "${shm:-$tmp}"
}
trap cleanup EXIT
cp=$(port); pp=$(port)
shm=$tmp
[ -w /dev/shm ] && shm=$(mktemp -d /dev/shm/psd-slot-add-XXXXXX)
"$etcd" --data-dir "$shm/etcd" --listen-client-urls "http://127.0.0.1:$cp" \
  --advertise-client-urls "http://127.0.0.1:$cp" --listen-peer-urls "http://127.0.0.1:$pp" \
  --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
  --initial-cluster "default=http://127.0.0.1:$pp" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
coord="http://127.0.0.1:$cp"
for _ in $(seq 100); do
  /usr/bin/python3 -c 'import urllib.request,sys; urllib.request.urlopen(sys.argv[1], b"{\"key\":\"AA==\"}", timeout=1)' "$coord/v3/kv/range" 2>/dev/null && break
  sleep 0.1
done
wait_log() { # file text seconds
  for _ in $(seq $(( $3 * 10 ))); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
etcd_put() { # key value
  /usr/bin/python3 -c 'import urllib.request,sys,base64,json; b=lambda s: base64.b64encode(s.encode()).decode(); urllib.request.urlopen(sys.argv[1]+"/v3/kv/put", json.dumps({"key":b(sys.argv[2]),"value":b(sys.argv[3])}).encode(), timeout=3)' "$coord" "$1" "$2"
}
etcd_del() {
  /usr/bin/python3 -c 'import urllib.request,sys,base64,json; urllib.request.urlopen(sys.argv[1]+"/v3/kv/deleterange", json.dumps({"key":base64.b64encode(sys.argv[2].encode()).decode()}).encode(), timeout=3)' "$coord" "$1"
}

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
export PS_RETRIES=100 PS_DEADLINE_MS=60000
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
sleep 1
touch "$tmp/stop"
if wait $pusher_pid; then echo "ok   pushers: $(grep -c 'joined the cluster' "$tmp/push.log") connection(s) to the new server, $(tail -1 "$tmp/push.log")"
else echo "FAIL pushers:"; cat "$tmp/push.log"; fail=1; fi
if wait $stepper_pid; then echo "ok   steps: $(tail -1 "$tmp/step.log")"
else echo "FAIL steps:"; cat "$tmp/step.log"; fail=1; fi
check exact 0 "equals its acknowledged pushes" "$pusher" check "$tmp/hist" "$tmp/hist2"
[ $fail -eq 0 ] || { for i in 0 1 2; do echo "--- ps$i"; tail -20 "$tmp/ps$i.log"; done; }
exit $fail
