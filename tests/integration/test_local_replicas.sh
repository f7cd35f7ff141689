#!/usr/bin/env bash
# ps-local --replicas N: starts its own etcd (data in a private directory under $TMPDIR,
# removed at exit), passes replicas and coordinator to every ps-server, which install the
# first view; bad combinations exit 2 naming the problem. One ps SIGKILLed of 2 with replicas 2
# leaves the run going (its groups fail over); the second stops the cluster (exit 137).
# Usage: test_local_replicas.sh PS_SERVER PS_WORKER PS_LOCAL
set -u
server=$1 worker=$2 local=$3
fail=0
tmp=$(mktemp -d /tmp/psd-local-replicas-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=../support/check.sh
. "$(dirname "$0")/../support/check.sh"
check more-replicas-than-ps 2 "replicas 3: more than --ps 2" "$local" --server "$server" --worker "$worker" --ps 2 --replicas 3
check no-etcd 2 "needs etcd" "$local" --server "$server" --worker "$worker" --ps 2 --replicas 2 --etcd /nonexistent/etcd
if [ ! -x "${PSD_ETCD:-/usr/bin/etcd}" ]; then
  echo "SKIP the rest: no etcd (install Debian's etcd-server)"
  [ $fail -eq 0 ] && exit 77
  exit $fail
fi
etcd_arg=()
[ -n "${PSD_ETCD:-}" ] && etcd_arg=(--etcd "$PSD_ETCD")
out=$(TMPDIR=$tmp "$local" --server "$server" --worker "$worker" --ps 3 --workers 2 --replicas 2 \
  "${etcd_arg[@]}" -- --steps 20 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "for --replicas 2" <<<"$out" && grep -q "training succeeded" <<<"$out"; then
  echo "ok   ps-local --replicas 2 trains"
else
  echo "FAIL ps-local --replicas 2: exit $rc"; tail -n 30 <<<"$out"; fail=1
fi
for i in 0 1 2; do
  if ! /usr/bin/python3 -c '
import json, sys
ok = any(l.startswith("{") and json.loads(l).get("role") == "ps" and json.loads(l).get("task") == int(sys.argv[1])
         and "view epoch 1, primaries [0 1 2], live [0 1 2]" in json.loads(l)["msg"] for l in sys.stdin)
sys.exit(0 if ok else 1)' $i <<<"$out"; then
    echo "FAIL ps $i never saw the first view"; fail=1
  fi
done
# A ps that dies is not fatal while fewer than --replicas have died; the replicas-th is.
log=$tmp/deaths.log
TMPDIR=$tmp "$local" --server "$server" --worker "$worker" --ps 2 --workers 1 --replicas 2 \
  "${etcd_arg[@]}" --timeout 100 -- --steps 1000000 --staleness -1 --log-every 20 >/dev/null 2>"$log" &
lpid=$!
for _ in $(seq 300); do grep -q '"step"' "$log" && break; sleep 0.1; done
ps0=$(sed -n 's/.*started ps 0 (pid \([0-9]*\)).*/\1/p' "$log" | head -n 1)
ps1=$(sed -n 's/.*started ps 1 (pid \([0-9]*\)).*/\1/p' "$log" | head -n 1)
if [ -z "$ps0" ] || [ -z "$ps1" ] || ! grep -q '"step"' "$log"; then
  echo "FAIL deaths: no ps pids or no step logged"; tail -n 20 "$log"; fail=1; kill "$lpid"
else
  kill -KILL "$ps0"
  for _ in $(seq 50); do grep -q "fail over to their other copies" "$log" && break; sleep 0.1; done
  sleep 1
  if kill -0 "$lpid" 2>/dev/null && grep -q "ps 0 (pid $ps0) was killed by signal 9.*fail over to their other copies (--replicas 2): training goes on with 1 of 2 servers" "$log"; then
    echo "ok   first ps death: the groups fail over, training goes on"
  else
    echo "FAIL first ps death stopped ps-local or was not reported"; tail -n 20 "$log"; fail=1
  fi
  kill -KILL "$ps1"
  wait "$lpid"; rc=$?
  if [ $rc -eq 137 ] && grep -q "ps 1 (pid $ps1) was killed by signal 9.*stopping the cluster" "$log"; then
    echo "ok   second ps death (--replicas 2): the cluster stops, exit 137"
  else
    echo "FAIL second ps death: exit $rc (want 137)"; tail -n 20 "$log"; fail=1
  fi
fi
grep -q "revoked lease" <<<"$out" && echo "ok   servers revoke their leases at exit" || { echo "FAIL no lease revoked"; fail=1; }
if ls "$tmp" | grep -q ps-local-etcd; then
  echo "FAIL etcd's directory left behind: $(ls "$tmp")"; fail=1
else
  echo "ok   etcd's directory removed"
fi
pgrep -f "$tmp/ps-local-etcd" >/dev/null && { echo "FAIL etcd still runs"; fail=1; }
exit $fail
