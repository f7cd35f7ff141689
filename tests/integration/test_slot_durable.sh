#!/usr/bin/env bash
# A move is durable on its target: two servers with a checkpoint-dir each hold variables and
# table rows that 2 client threads pushed; a third server joins (with a checkpoint-dir too),
# psctl add-server gives it a share of the slots, and it is killed -9 right after, before any
# checkpoint of its own was due. Restarted, it restores the slots moved to it (the install
# made them durable before the map gave them there), and every value equals the sum of the
# pushes acknowledged. Skipped (77) without etcd.
# Usage: test_slot_durable.sh PS_SERVER PSCTL SLOT_MOVE_PUSHER
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

tmp=$(mktemp -d /tmp/psd-slot-durable-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp" "${shm:-$tmp}"
}
trap cleanup EXIT
cp=$(port); pp=$(port)
shm=$tmp
[ -w /dev/shm ] && shm=$(mktemp -d /dev/shm/psd-slot-durable-XXXXXX)
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
pfx=/psd-slot-durable
ck=(--checkpoint-interval-s 3600 --checkpoint-interval-updates 0)
for i in 0 1; do
  "$bin" --cluster "$spec" --task ps:$i --coordinator "$coord" --coordinator-prefix $pfx \
    --checkpoint-dir "$tmp/ck$i" "${ck[@]}" 2>>"$tmp/ps$i.log" &
  pids+=($!)
done
for i in 0 1; do
  wait_log "$tmp/ps$i.log" "serving on" 15 || { echo "FAIL ps$i did not start"; cat "$tmp/ps$i.log"; exit 1; }
done
ctl=("$psctl" --cluster "$spec" --coordinator "$coord" --coordinator-prefix $pfx)

export TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" PS_COORDINATOR_PREFIX=$pfx
export PS_RETRIES=100 PS_DEADLINE_MS=60000
"$pusher" push "$tmp/hist" "$tmp/stop" >"$tmp/push.log" 2>&1 &
pusher_pid=$!; pids+=($pusher_pid)
sleep 2
touch "$tmp/stop"
if wait $pusher_pid; then echo "ok   pushers: $(tail -1 "$tmp/push.log")"
else echo "FAIL pushers:"; cat "$tmp/push.log"; fail=1; fi

join=("$bin" --cluster "$spec" --join --listen "tcp://${a[2]}" --coordinator "$coord"
      --coordinator-prefix $pfx --checkpoint-dir "$tmp/ck2" "${ck[@]}")
"${join[@]}" 2>>"$tmp/ps2.log" &
p2=$!; pids+=($p2)
wait_log "$tmp/ps2.log" "serving on" 15 || { echo "FAIL the joining server did not start"; cat "$tmp/ps2.log"; exit 1; }
check add-server 0 "add-server: done" "${ctl[@]}" --batch-slots 512 add-server "${a[2]}"
check install-durable 0 "durable in checkpoint" grep "are durable in checkpoint" "$tmp/ps2.log"
kill -9 $p2; wait $p2 2>/dev/null
"${join[@]}" 2>>"$tmp/ps2b.log" &
pids+=($!)
wait_log "$tmp/ps2b.log" "serving on" 15 || { echo "FAIL the joined server did not restart"; cat "$tmp/ps2b.log"; exit 1; }
check restored 0 "restores its slots" grep "restores its slots" "$tmp/ps2b.log"
check exact 0 "equals its acknowledged pushes" "$pusher" check "$tmp/hist"
[ $fail -eq 0 ] || { for f in ps0 ps1 ps2 ps2b; do echo "--- $f"; tail -20 "$tmp/$f.log"; done; }
exit $fail
