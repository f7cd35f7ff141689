#!/usr/bin/env bash
# ps-local --add-server: starts its own etcd with replicas 1, passes the coordinator to every
# process, and once the workers run starts one more ps-server with --join and runs psctl
# add-server; the run trains to the end and its summary says the server was added. Bad
# combinations exit 2 naming the problem. Skipped (77) without etcd.
# Usage: test_local_add_server.sh PS_SERVER PS_WORKER PS_LOCAL PSCTL
set -u
server=$1 worker=$2 local=$3 psctl=$4
fail=0
tmp=$(mktemp -d /tmp/psd-local-add-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=../support/check.sh
. "$(dirname "$0")/../support/check.sh"
check with-replicas 2 "add-server needs --replicas 1" "$local" --server "$server" --worker "$worker" --ps 2 --replicas 2 --add-server
check with-ipc 2 "add-server needs --transport tcp" "$local" --server "$server" --worker "$worker" --ps 2 --transport ipc --add-server
check no-etcd 2 "add-server needs etcd" "$local" --server "$server" --worker "$worker" --ps 2 --add-server --etcd /nonexistent/etcd
if [ ! -x "${PSD_ETCD:-/usr/bin/etcd}" ]; then
  echo "SKIP the rest: no etcd (install Debian's etcd-server)"
  [ $fail -eq 0 ] && exit 77
  exit $fail
fi
etcd_arg=()
[ -n "${PSD_ETCD:-}" ] && etcd_arg=(--etcd "$PSD_ETCD")
out=$(TMPDIR=$tmp "$local" --server "$server" --worker "$worker" --psctl "$psctl" --ps 2 \
  --workers 2 --add-server "${etcd_arg[@]}" --timeout 100 -- --steps 400 --log-every 50 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "for --add-server" <<<"$out" && grep -q "training succeeded" <<<"$out"; then
  echo "ok   ps-local --add-server trains"
else
  echo "FAIL ps-local --add-server: exit $rc"; tail -n 30 <<<"$out"; fail=1
fi
if grep -q '"summary":true.*"add_server":"ps 2 (.*) joined and psctl add-server gave it its share' <<<"$out"; then
  echo "ok   the summary says the server was added"
else
  echo "FAIL the summary does not say the server was added"; grep -E "summary|add-server|psctl" <<<"$out" | tail -n 20; fail=1
fi
if grep -q "add-server: done" <<<"$out"; then
  echo "ok   psctl add-server ran to the end"
else
  echo "FAIL psctl add-server did not finish"; fail=1
fi
if ls "$tmp" | grep -q ps-local-etcd; then
  echo "FAIL etcd's directory left behind: $(ls "$tmp")"; fail=1
else
  echo "ok   etcd's directory removed"
fi
exit $fail
