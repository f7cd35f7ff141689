#!/usr/bin/env bash
# A primary that loses its lease while a client's push waits on it, before it knows who took its
# group over: 2 ps-servers (replicas 2) and a real etcd on loopback, one client pushing
# identifiable gradients (tests/integration/replica_pusher.c) to a variable of group 1 (ps 1
# primary, ps 0 its backup). ps 0 is stopped (SIGSTOP: the push waits on ps 1 for its backup),
# ps 1's lease is revoked in etcd (ps 1 learns "lease lost" while no new view exists yet), then
# ps 0 continues and takes group 1 over. The waiting push must not fail: it is answered
# UNAVAILABLE (retried), then sent to the new primary; every acknowledged push is in the final
# values exactly once, and ps 1 rejoins.
#
#   test_replica_lease_lost.sh PS_SERVER REPLICA_PUSHER
#
# The servers' leases are 9 s (renewed every 3 s): ps 0 stays stopped until ps 1 learnt of its
# lease's loss (up to a renewal interval, more on a loaded machine), and its own lease must
# outlive that stop, or both servers lose theirs and the view is rebuilt without a takeover.
#
# Exit 77 (skipped) without etcd.
set -u
PS_SERVER=${1:?ps-server}
PUSHER=${2:?replica_pusher}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../support/procs.sh
. "$here/../support/procs.sh"
ETCD=${PSD_ETCD:-/usr/bin/etcd}
if [ ! -x "$ETCD" ]; then
    echo "SKIP: no etcd at $ETCD (install Debian's etcd-server)"
    exit 77
fi
tmp=$(mktemp -d /tmp/ps-test-lease-lost-XXXXXX)
data=$tmp/etcd
[ -w /dev/shm ] && data=$(mktemp -d /dev/shm/ps-test-lease-lost-XXXXXX)
at_exit() {
    [ -z "${ps0:-}" ] || kill -CONT "$ps0" 2>/dev/null
    [ "$data" = "$tmp/etcd" ] || rm -rf "$data"
}
procs_on_exit at_exit
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cp=$(port)
pp=$(port)
coord="http://127.0.0.1:$cp"
"$ETCD" --data-dir "$data/d" --listen-client-urls "$coord" --advertise-client-urls "$coord" \
    --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
    --initial-cluster "default=http://127.0.0.1:$pp" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
spec="{\"ps\":[\"127.0.0.1:$(port)\",\"127.0.0.1:$(port)\"]}"
for i in 0 1; do
    "$PS_SERVER" --cluster "$spec" --task "ps:$i" --replicas 2 --coordinator "$coord" \
        --lease-ms 9000 --log-format text 2>"$tmp/ps$i.log" &
    pids+=($!)
done
ps0=${pids[1]}
ps1=${pids[2]}
for i in 0 1; do
    wait_log "$tmp/ps$i.log" "view epoch 1, primaries \[0 1\], live \[0 1\]" 30 ||
        fail "ps $i: no first view"
done
echo "ok   first view"
"$PUSHER" push "$spec" ll/v group1 0 4096 "$tmp/hist" "$tmp/stop" 5 2>"$tmp/client.log" &
client=$!
pids+=($client)
sleep 1.5
grep -q "^ack" "$tmp/hist" || fail "no push acknowledged before the test"
lease=$(sed -n 's/.*registered in etcd .*(lease \([0-9]*\),.*/\1/p' "$tmp/ps1.log" | tail -n 1)
[ -n "$lease" ] || fail "ps 1's lease is not in its log"
kill -STOP "$ps0"
sleep 0.2
/usr/bin/python3 -c 'import urllib.request,sys; urllib.request.urlopen(sys.argv[1], ("{\"ID\":\"%s\"}" % sys.argv[2]).encode(), timeout=2)' \
    "$coord/v3/lease/revoke" "$lease" || fail "cannot revoke lease $lease"
echo "     ps 0 stopped, ps 1's lease $lease revoked"
wait_log "$tmp/ps1.log" "lease lost" 6 || fail "ps 1 did not learn that its lease is gone"
grep -q "view epoch 2" "$tmp/ps1.log" && fail "test timing: ps 1 saw the new view before its lease loss"
sleep 0.5
kill -CONT "$ps0"
echo "ok   ps 1 learnt its lease is gone with a push waiting on it and no newer view; ps 0 continued"
wait_log "$tmp/ps0.log" "view epoch 2, primaries \[0 0\], live \[0\]" 10 || fail "ps 0 did not take group 1 over"
wait_log "$tmp/ps0.log" "view epoch 3, primaries \[0 0\], live \[0 1\]" 20 || fail "ps 1 did not rejoin"
echo "ok   ps 0 took group 1 over (epoch 2), ps 1 rejoined (epoch 3)"
sleep 1
touch "$tmp/stop"
wait_for "$client" 60 || fail "the client failed (exit $?): $(cat "$tmp/client.log")"
echo "ok   the client's pushes all acknowledged"
out=$("$PUSHER" check "$spec" ll/v group1 "$tmp/hist" 2>&1) || fail "check: $out"
echo "ok   $out"
kill -TERM "$ps0" "$ps1"
wait_for "$ps0" 20 || fail "ps 0: exit $? on SIGTERM"
wait_for "$ps1" 20 || fail "ps 1: exit $? on SIGTERM"
echo "ok   both servers exit 0 on SIGTERM"
