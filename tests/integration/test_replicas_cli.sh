#!/usr/bin/env bash
# ps-server with replicas > 1: configuration errors exit 2 with a message naming the problem;
# with a real etcd (started here): the first view, `psctl view` (text and JSON), the view
# metrics, a view of another shape refused at start, a SIGKILLed server dropped from the view
# within its lease, and a server that keeps serving while etcd is down.
# Usage: test_replicas_cli.sh PS_SERVER PSCTL
set -u
bin=$1 psctl=$2
fail=0
# shellcheck source=../support/cli_etcd.sh
. "$(dirname "$0")/../support/cli_etcd.sh"
two='{"ps":["127.0.0.1:1","127.0.0.1:2"]}'
check no-coordinator 2 "replicas 2 needs a coordinator" "$bin" --cluster "$two" --task ps:0 --replicas 2
check too-many-replicas 2 "needs that many distinct servers" "$bin" --cluster "$two" --task ps:0 --replicas 3 --coordinator http://127.0.0.1:1
check https-coordinator 2 "https is not supported" "$bin" --cluster "$two" --task ps:0 --replicas 2 --coordinator https://127.0.0.1:1
check bad-coordinator 2 "expected http://host:port" "$bin" --cluster "$two" --task ps:0 --replicas 2 --coordinator http://127.0.0.1
check bad-lease 2 "lease-ms" "$bin" --cluster "$two" --task ps:0 --replicas 2 --coordinator http://127.0.0.1:1 --lease-ms 10
check psctl-no-coordinator 2 "set coordinator" "$psctl" --cluster "$two" view

etcd_setup replicas-cli

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
check psctl-view-etcd-down 1 "${coord#http://}: cannot connect" "$psctl" --cluster "$spec" --coordinator "$coord" view
kill -TERM $pid0
wait $pid0; rc=$?
[ $rc -eq 0 ] && echo "ok   SIGTERM exits 0" || { echo "FAIL SIGTERM: exit $rc"; fail=1; }

# A lease lost before the first view (a server stalled while it waits for the others): it
# registers again and serves its groups once the view forms (it used to refuse every view).
etcd_start etcd2 || { echo "FAIL the second etcd did not answer"; exit 1; }
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
