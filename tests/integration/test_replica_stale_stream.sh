#!/usr/bin/env bash
# A replication stream whose connection goes silent while both servers stay up: 2 ps-servers
# (replicas 2) and a real etcd on loopback, one client pushing identifiable gradients
# (tests/integration/replica_pusher.c) to a variable of group 1 (ps 1 primary, ps 0 its
# backup). Once pushes are acknowledged, every TCP connection ps 1 holds open to ps 0 is
# blackholed with iptables (both directions, those connections only: a new connection
# passes), as a lost conntrack or NAT entry or a stalled peer socket would. Both servers keep
# their leases, so the view never changes: the primary must notice that its stream's batches
# go unanswered and open its connection again, and pushes are acknowledged again within the
# client's deadline. Then ps 0's port is blackholed for everyone (it still reaches ps 1 and
# etcd, and keeps its lease: an asymmetric partition): ps 1 must take ps 0 out of sync in
# group 1 (a view with ps 0 live but out of sync) and acknowledge without it; once healed,
# ps 0 copies group 1 again and is its backup again. Every acknowledged push is in the final
# values exactly once.
#
#   test_replica_stale_stream.sh PS_SERVER REPLICA_PUSHER
#
# Exit 77 (skipped) without etcd, iptables or ss, or when not root.
set -u
PS_SERVER=${1:?ps-server}
PUSHER=${2:?replica_pusher}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../support/procs.sh
. "$here/../support/procs.sh"
skip() {
    echo "SKIP: $*"
    exit 77
}
ETCD=${PSD_ETCD:-/usr/bin/etcd}
[ -x "$ETCD" ] || skip "no etcd at $ETCD (install Debian's etcd-server)"
[ "$(id -u)" = 0 ] || skip "needs root (iptables)"
command -v iptables >/dev/null 2>&1 || skip "no iptables"
command -v ss >/dev/null 2>&1 || skip "no ss (iproute2)"
iptables -w -L OUTPUT -n >/dev/null 2>&1 || skip "iptables does not work here"
tmp=$(mktemp -d /tmp/ps-test-stale-stream-XXXXXX)
data=$tmp/etcd
[ -w /dev/shm ] && data=$(mktemp -d /dev/shm/ps-test-stale-stream-XXXXXX)
rules=()
unblock() {
    local r
    for r in "${rules[@]}"; do
        # shellcheck disable=SC2086
        iptables -w -D OUTPUT $r 2>/dev/null
    done
    rules=()
}
at_exit() {
    unblock
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
p0=$(port)
spec="{\"ps\":[\"127.0.0.1:$p0\",\"127.0.0.1:$(port)\"]}"
for i in 0 1; do
    "$PS_SERVER" --cluster "$spec" --task "ps:$i" --replicas 2 --coordinator "$coord" \
        --lease-ms 3000 --log-format text 2>"$tmp/ps$i.log" &
    pids+=($!)
done
ps0=${pids[1]}
ps1=${pids[2]}
for i in 0 1; do
    wait_log "$tmp/ps$i.log" "view epoch 1, primaries \[0 1\], live \[0 1\]" 30 ||
        fail "ps $i: no first view"
done
echo "ok   first view"
"$PUSHER" push "$spec" ss/v group1 0 4096 "$tmp/hist" "$tmp/stop" 5 2>"$tmp/client.log" &
client=$!
pids+=($client)
acks() { cat "$tmp/hist" 2>/dev/null | awk '/^ack/ {n++} END {print n + 0}'; }
for _ in $(seq 100); do
    [ "$(acks)" -ge 20 ] && break
    sleep 0.1
done
[ "$(acks)" -ge 20 ] || fail "fewer than 20 pushes acknowledged before the test"
# Every connection ps 1 holds to ps 0's port, by its local port: blackholed both ways.
flows=$(ss -tnpH state established "( dport = :$p0 )" | grep "pid=$ps1," |
    awk '{print $3}' | sed 's/.*://')
[ -n "$flows" ] || fail "ps 1 holds no connection to ps 0: $(ss -tnp)"
for f in $flows; do
    rules+=("-p tcp -s 127.0.0.1 -d 127.0.0.1 --sport $f --dport $p0 -j DROP")
    rules+=("-p tcp -s 127.0.0.1 -d 127.0.0.1 --sport $p0 --dport $f -j DROP")
done
for r in "${rules[@]}"; do
    # shellcheck disable=SC2086
    iptables -w -I OUTPUT $r || fail "iptables -I OUTPUT $r"
done
before=$(acks)
echo "     blackholed ps 1's $(echo "$flows" | wc -w) connection(s) to ps 0 after $before pushes"
# Pushes must go on: the stream's batches go unanswered, the primary opens it again.
ok=0
for _ in $(seq 400); do
    if [ "$(acks)" -ge $((before + 40)) ]; then
        ok=1
        break
    fi
    sleep 0.1
done
[ "$ok" = 1 ] || fail "group 1 took no push for 40 s after its stream's connection went silent ($(acks) acknowledged, $before before)"
grep -q "view epoch 2" "$tmp/ps0.log" "$tmp/ps1.log" &&
    fail "the view changed: the test meant both servers to stay in it"
echo "ok   pushes acknowledged again ($(acks) after $before), the view unchanged"
grep -q "opening it again" "$tmp/ps1.log" || fail "ps 1 did not say it opened its stream again"
echo "ok   $(grep -m1 "opening it again" "$tmp/ps1.log" | sed 's/^.*group/group/')"
unblock
# An asymmetric partition: nobody reaches ps 0's port; ps 0 reaches ps 1 and etcd.
rules=("-p tcp --dport $p0 -j DROP" "-p tcp --sport $p0 -j DROP")
for r in "${rules[@]}"; do
    # shellcheck disable=SC2086
    iptables -w -I OUTPUT $r || fail "iptables -I OUTPUT $r"
done
before=$(acks)
echo "     ps 0's port blackholed after $before pushes"
wait_log "$tmp/ps1.log" "backup 0 unreachable for .* asking the coordinator to take it out of sync" 60 ||
    fail "ps 1 did not report ps 0 unreachable"
wait_log "$tmp/ps1.log" "view epoch [0-9]*, primaries \[0 1\], live \[0 1\], out of sync \[g1: 0\]" 20 ||
    fail "no view took ps 0 out of sync in group 1 while live"
ok=0
for _ in $(seq 300); do
    if [ "$(acks)" -ge $((before + 40)) ]; then
        ok=1
        break
    fi
    sleep 0.1
done
[ "$ok" = 1 ] || fail "group 1 took no push after ps 0 was taken out of sync ($(acks) acknowledged, $before before)"
echo "ok   ps 1 took ps 0 out of sync in group 1 and acknowledged without it ($(acks) after $before)"
unblock
wait_log "$tmp/ps1.log" "server 0 is a backup of group 1 again" 60 ||
    fail "ps 0 did not come back in sync in group 1 after the heal"
echo "ok   healed: ps 0 copied group 1 again and is its backup again"
touch "$tmp/stop"
wait_for "$client" 90 || fail "the client failed (exit $?): $(cat "$tmp/client.log")"
unblock
out=$("$PUSHER" check "$spec" ss/v group1 "$tmp/hist" 2>&1) || fail "check: $out"
echo "ok   $out"
kill -TERM "$ps0" "$ps1"
wait_for "$ps0" 30 || fail "ps 0: exit $? on SIGTERM"
wait_for "$ps1" 30 || fail "ps 1: exit $? on SIGTERM"
echo "ok   both servers exit 0 on SIGTERM"
