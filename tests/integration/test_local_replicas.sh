#!/usr/bin/env bash
# ps-local --replicas N: starts its own etcd (data in a private directory under $TMPDIR,
# removed at exit), passes replicas and coordinator to every ps-server, which install the
# first view; bad combinations exit 2 naming the problem.
# Usage: test_local_replicas.sh PS_SERVER PS_WORKER PS_LOCAL
set -u
server=$1 worker=$2 local=$3
fail=0
tmp=$(mktemp -d /tmp/psd-local-replicas-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
check() { # name expected-exit expected-text command...
  local name=$1 want=$2 text=$3; shift 3
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -q -- "$text" <<<"$out"; then
    echo "FAIL $name: exit $rc (want $want), output: $(tail -n 20 <<<"$out")"; fail=1
  else
    echo "ok   $name"
  fi
}
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
grep -q "revoked lease" <<<"$out" && echo "ok   servers revoke their leases at exit" || { echo "FAIL no lease revoked"; fail=1; }
if ls "$tmp" | grep -q ps-local-etcd; then
  echo "FAIL etcd's directory left behind: $(ls "$tmp")"; fail=1
else
  echo "ok   etcd's directory removed"
fi
pgrep -f "$tmp/ps-local-etcd" >/dev/null && { echo "FAIL etcd still runs"; fail=1; }
exit $fail
