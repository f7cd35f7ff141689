#!/usr/bin/env bash
# A server that rejoins without restarting (its lease lost: here revoked in etcd) copies its
# groups again and frees the copies they replace: 2 ps-servers (replicas 2) and a real etcd on
# loopback, one client pushing identifiable gradients (tests/integration/replica_pusher.c) to a
# variable of group 1. ps 1's lease is revoked three times; each time ps 0 takes both groups,
# ps 1 registers again, copies both groups from ps 0 and rejoins. After the third rejoin ps 1's
# /metrics shows 2 copies of group state held (psd_replica_state_copies), not 2 more per
# rejoin, every acknowledged push is in the final values exactly once, and both servers stop
# cleanly.
#
#   test_replica_rejoin_frees.sh PS_SERVER REPLICA_PUSHER
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
tmp=$(mktemp -d /tmp/ps-test-rejoin-frees-XXXXXX)
data=$tmp/etcd
[ -w /dev/shm ] && data=$(mktemp -d /dev/shm/ps-test-rejoin-frees-XXXXXX)
at_exit() {
    [ "$data" = "$tmp/etcd" ] || rm -rf "$data"
}
procs_on_exit at_exit
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
metric() { # metric PORT NAME: its value on that server's /metrics
    /usr/bin/python3 -c 'import urllib.request,sys
for l in urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode().splitlines():
    if l.startswith(sys.argv[2] + " "): print(l.split()[1])' "$1" "$2"
}
cp=$(port)
pp=$(port)
coord="http://127.0.0.1:$cp"
"$ETCD" --data-dir "$data/d" --listen-client-urls "$coord" --advertise-client-urls "$coord" \
    --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
    --initial-cluster "default=http://127.0.0.1:$pp" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
spec="{\"ps\":[\"127.0.0.1:$(port)\",\"127.0.0.1:$(port)\"]}"
hp=("$(port)" "$(port)")
for i in 0 1; do
    "$PS_SERVER" --cluster "$spec" --task "ps:$i" --replicas 2 --coordinator "$coord" \
        --lease-ms 3000 --http-listen "127.0.0.1:${hp[$i]}" --log-format text \
        2>"$tmp/ps$i.log" &
    pids+=($!)
done
ps0=${pids[1]}
ps1=${pids[2]}
for i in 0 1; do
    wait_log "$tmp/ps$i.log" "view epoch 1, primaries \[0 1\], live \[0 1\]" 30 ||
        fail "ps $i: no first view"
done
echo "ok   first view"
[ "$(metric "${hp[1]}" psd_replica_state_copies)" = "2" ] || fail "ps 1 does not hold 2 copies at start"
"$PUSHER" push "$spec" rf/v group1 0 4096 "$tmp/hist" "$tmp/stop" 5 2>"$tmp/client.log" &
client=$!
pids+=($client)
sleep 1
grep -q "^ack" "$tmp/hist" || fail "no push acknowledged before the test"
for round in 1 2 3; do
    lease=$(sed -n 's/.*registered in etcd .*(lease \([0-9]*\),.*/\1/p' "$tmp/ps1.log" | tail -n 1)
    [ -n "$lease" ] || fail "ps 1's lease is not in its log"
    /usr/bin/python3 -c 'import urllib.request,sys; urllib.request.urlopen(sys.argv[1], ("{\"ID\":\"%s\"}" % sys.argv[2]).encode(), timeout=2)' \
        "$coord/v3/lease/revoke" "$lease" || fail "cannot revoke lease $lease"
    n=$(grep -c "installed a copy" "$tmp/ps1.log")
    # Rejoined: both groups copied again, and a view with ps 1 live after them.
    for _ in $(seq 300); do
        [ "$(grep -c "installed a copy" "$tmp/ps1.log")" -ge $((n + 2)) ] && break
        sleep 0.1
    done
    [ "$(grep -c "installed a copy" "$tmp/ps1.log")" -ge $((n + 2)) ] ||
        fail "round $round: ps 1 did not copy its groups again"
    e=$(sed -n 's/.*view epoch \([0-9]*\),.*/\1/p' "$tmp/ps0.log" | tail -n 1)
    for _ in $(seq 300); do
        grep "view epoch [0-9]*, primaries" "$tmp/ps0.log" | tail -n 1 | grep -q "live \[0 1\]" && break
        sleep 0.1
    done
    grep "view epoch [0-9]*, primaries" "$tmp/ps0.log" | tail -n 1 | grep -q "live \[0 1\]" ||
        fail "round $round: ps 1 did not rejoin (last view epoch $e)"
    rss=$(sed -n 's/^VmRSS:[[:space:]]*//p' "/proc/$ps1/status")
    echo "ok   round $round: ps 1's lease $lease revoked, ps 1 copied its groups and rejoined (RSS $rss)"
done
copies=$(metric "${hp[1]}" psd_replica_state_copies)
[ "$copies" = "2" ] || fail "ps 1 holds $copies copies of group state after 3 rejoins, not 2"
echo "ok   ps 1 holds 2 copies of group state after 3 rejoins"
touch "$tmp/stop"
wait_for "$client" 60 || fail "the client failed (exit $?): $(cat "$tmp/client.log")"
out=$("$PUSHER" check "$spec" rf/v group1 "$tmp/hist" 2>&1) || fail "check: $out"
echo "ok   $out"
kill -TERM "$ps0" "$ps1"
wait_for "$ps0" 20 || fail "ps 0: exit $? on SIGTERM"
wait_for "$ps1" 20 || fail "ps 1: exit $? on SIGTERM"
echo "ok   both servers exit 0 on SIGTERM"
