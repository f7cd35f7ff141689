#!/usr/bin/env bash
# ps-server with replicas > 1: configuration errors exit 2 with a message naming the problem;
# with a real etcd (started here): the first view, `psctl view` (text and JSON), the view
# metrics, a view of another shape refused at start, a SIGKILLed server dropped from the view
# within its lease, and a server that keeps serving while etcd is down.
# Usage: test_replicas_cli.sh PS_SERVER PSCTL
set -u
bin=$1 psctl=$2
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
two='{"ps":["127.0.0.1:1","127.0.0.1:2"]}'
check no-coordinator 2 "replicas 2 needs a coordinator" "$bin" --cluster "$two" --task ps:0 --replicas 2
check too-many-replicas 2 "needs that many distinct servers" "$bin" --cluster "$two" --task ps:0 --replicas 3 --coordinator http://127.0.0.1:1
check https-coordinator 2 "https is not supported" "$bin" --cluster "$two" --task ps:0 --replicas 2 --coordinator https://127.0.0.1:1
check bad-coordinator 2 "expected http://host:port" "$bin" --cluster "$two" --task ps:0 --replicas 2 --coordinator http://127.0.0.1
check bad-lease 2 "lease-ms" "$bin" --cluster "$two" --task ps:0 --replicas 2 --coordinator http://127.0.0.1:1 --lease-ms 10
check psctl-no-coordinator 2 "set coordinator" "$psctl" --cluster "$two" view

etcd=${PSD_ETCD:-/usr/bin/etcd}
if [ ! -x "$etcd" ]; then
  echo "SKIP the rest: no etcd at $etcd (install Debian's etcd-server)"
  [ $fail -eq 0 ] && exit 77
  exit $fail
fi

tmp=$(mktemp -d /tmp/psd-replicas-cli-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp" "${shm:-$tmp}"
}
trap cleanup EXIT
cp=$(port); pp=$(port)
# etcd's data on tmpfs when there is one (fsyncs on a busy disk stall it for seconds).
shm=$tmp
[ -w /dev/shm ] && shm=$(mktemp -d /dev/shm/psd-replicas-cli-XXXXXX)
"$etcd" --data-dir "$shm/etcd" --listen-client-urls "http://127.0.0.1:$cp" \
  --advertise-client-urls "http://127.0.0.1:$cp" --listen-peer-urls "http://127.0.0.1:$pp" \
  --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
  --initial-cluster "default=http://127.0.0.1:$pp" >"$tmp/etcd.log" 2>&1 &
etcd_pid=$!; pids+=($etcd_pid)
coord="http://127.0.0.1:$cp"
# Ready once it answers a read (it listens before it has a leader).
for _ in $(seq 100); do
  /usr/bin/python3 -c 'import urllib.request,sys; urllib.request.urlopen(sys.argv[1], b"{\"key\":\"AA==\"}", timeout=1)' "$coord/v3/kv/range" 2>/dev/null && break
  sleep 0.1
done

p0=$(port); p1=$(port); h0=$(port)
spec="{\"ps\":[\"127.0.0.1:$p0\",\"127.0.0.1:$p1\"]}"
start() { # index extra...
  local i=$1; shift
  "$bin" --cluster "$spec" --task ps:$i --replicas 2 --coordinator "$coord" "$@" 2>>"$tmp/ps$i.log" &
  pids+=($!)
}
start 0 --http-listen 127.0.0.1:$h0
pid0=${pids[-1]}
start 1
pid1=${pids[-1]}
wait_log() { # file text seconds
  for _ in $(seq $(( $3 * 10 ))); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
if wait_log "$tmp/ps0.log" "view epoch 1" 15 && wait_log "$tmp/ps1.log" "view epoch 1" 5; then
  echo "ok   first view"
else
  echo "FAIL first view"; cat "$tmp/ps0.log" "$tmp/ps1.log"; fail=1
fi
check psctl-view 0 "view epoch 1 under /psd/" "$psctl" --cluster "$spec" --coordinator "$coord" view
out=$("$psctl" --cluster "$spec" --coordinator "$coord" --json view)
if /usr/bin/python3 -c '
import json, sys
v = json.loads(sys.argv[1])
assert v["epoch"] == 1 and v["num_servers"] == 2 and v["replicas"] == 2, v
assert [g["primary"] for g in v["groups"]] == [0, 1], v
assert [g["backups"] for g in v["groups"]] == [[1], [0]], v
assert all(s["live"] and s["registered"] for s in v["servers"]), v
assert v["servers"][1]["url"] == "tcp://127.0.0.1:'$p1'", v
' "$out"; then echo "ok   psctl view --json"; else echo "FAIL psctl view --json: $out"; fail=1; fi
prefix=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["prefix"])' "$out")
metrics=$(/usr/bin/python3 -c 'import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "http://127.0.0.1:$h0/metrics")
if grep -q '^psd_view_epoch 1$' <<<"$metrics" && grep -q '^psd_coordinator_errors_total ' <<<"$metrics"; then
  echo "ok   metrics"
else
  echo "FAIL metrics: $(grep -E 'psd_view|psd_coord|psd_failover' <<<"$metrics")"; fail=1
fi
# A cluster of another shape at the same prefix: refused at start (exit 2).
p2=$(port)
check other-cluster 2 "another cluster uses coordinator-prefix $prefix" "$bin" --cluster "{\"ps\":[\"127.0.0.1:$p0\",\"127.0.0.1:$p1\",\"127.0.0.1:$p2\"]}" --task ps:2 --replicas 2 --coordinator "$coord" --coordinator-prefix "$prefix"

# SIGKILL server 1 (primary of group 1): server 0 takes over group 1 within the lease.
t0=$(date +%s%N)
kill -9 $pid1
if wait_log "$tmp/ps0.log" "view epoch 2, primaries \[0 0\], live \[0\]" 10; then
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "ok   failover after SIGKILL in $ms ms"
  [ $ms -le 4500 ] || { echo "FAIL failover took $ms ms (lease 2000 ms)"; fail=1; }
else
  echo "FAIL no failover"; cat "$tmp/ps0.log"; fail=1
fi
check psctl-view-down 0 "1      down" "$psctl" --cluster "$spec" --coordinator "$coord" view
metrics=$(/usr/bin/python3 -c 'import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "http://127.0.0.1:$h0/metrics")
grep -q '^psd_failovers_total 1$' <<<"$metrics" && grep -q '^psd_view_epoch 2$' <<<"$metrics" \
  && echo "ok   failover metrics" || { echo "FAIL failover metrics: $(grep -E 'psd_view|psd_failover' <<<"$metrics")"; fail=1; }

# etcd down: the server keeps serving and says why failover waits.
kill -9 $etcd_pid
if wait_log "$tmp/ps0.log" "failover waits for etcd" 5 && kill -0 $pid0; then
  echo "ok   etcd down: server 0 serves on, logged"
else
  echo "FAIL etcd down"; tail "$tmp/ps0.log"; fail=1
fi
check psctl-view-etcd-down 1 "127.0.0.1:$cp: cannot connect" "$psctl" --cluster "$spec" --coordinator "$coord" view
kill -TERM $pid0
wait $pid0; rc=$?
[ $rc -eq 0 ] && echo "ok   SIGTERM exits 0" || { echo "FAIL SIGTERM: exit $rc"; fail=1; }

# A lease lost before the first view (a server stalled while it waits for the others): it
# registers again and serves its groups once the view forms (it used to refuse every view).
cp=$(port); pp=$(port)
"$etcd" --data-dir "$shm/etcd2" --listen-client-urls "http://127.0.0.1:$cp" \
  --advertise-client-urls "http://127.0.0.1:$cp" --listen-peer-urls "http://127.0.0.1:$pp" \
  --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
  --initial-cluster "default=http://127.0.0.1:$pp" >"$tmp/etcd2.log" 2>&1 &
pids+=($!)
coord="http://127.0.0.1:$cp"
for _ in $(seq 100); do
  /usr/bin/python3 -c 'import urllib.request,sys; urllib.request.urlopen(sys.argv[1], b"{\"key\":\"AA==\"}", timeout=1)' "$coord/v3/kv/range" 2>/dev/null && break
  sleep 0.1
done
p0=$(port); p1=$(port)
spec="{\"ps\":[\"127.0.0.1:$p0\",\"127.0.0.1:$p1\"]}"
: >"$tmp/ps0.log"; : >"$tmp/ps1.log"
start 0
pid0=${pids[-1]}
if wait_log "$tmp/ps0.log" "the first view waits for every server" 10; then
  kill -STOP $pid0; sleep 4; kill -CONT $pid0
  start 1
  pid1=${pids[-1]}
  if wait_log "$tmp/ps0.log" "lease lost before the first view" 10 &&
     wait_log "$tmp/ps0.log" "view epoch 1, primaries \[0 1\], live \[0 1\]" 20; then
    out=$(timeout 30 "$psctl" --cluster "$spec" --replicas 2 --coordinator "$coord" dump nosuch "$tmp/x.bin" 2>&1)
    if grep -q 'NOT_FOUND' <<<"$out"; then
      echo "ok   lease lost before the first view: served once the view formed"
    else
      echo "FAIL lease lost before the first view: a pull of a missing variable said: $out"; fail=1
    fi
  else
    echo "FAIL lease lost before the first view: no view"; cat "$tmp/ps0.log"; fail=1
  fi
  kill -TERM $pid0 $pid1 2>/dev/null
else
  echo "FAIL server 0 alone did not wait for the first view"; cat "$tmp/ps0.log"; fail=1
fi
exit $fail
