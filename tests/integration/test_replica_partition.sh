#!/usr/bin/env bash
# A primary cut off by a network partition while clients push (tests/support/netns.sh: etcd,
# 3 ps-servers with replicas 2 and a client host, each in a network namespace of its own).
# Server 1 (primary of group 1) loses its cable: it is cut off from its backup, the other
# servers, etcd and the client host; one client in server 1's own namespace goes on pushing to
# it (a variable of group 1), 3 clients on the client host push to a variable split over every
# group. Identifiable pushes (tests/integration/replica_pusher.c).
#   - the cut-off primary acknowledges nothing once its lease has expired (the isolated
#     client's acknowledgements against the time of the cut);
#   - the others install the view without it (group 1 served by server 2, epoch 2) and the
#     clients on their side are acknowledged again before the heal;
#   - once the cable is back, server 1 learns its lease is gone and rejoins (a view with it
#     live again), the isolated client's held push is acknowledged by the new primary;
#   - then ps 2, primary of groups 1 and 2 by then, loses etcd only (iptables DROP): the others
#     take its groups over and refuse its stream, every client is acknowledged again, ps 2
#     rejoins once etcd is reachable;
#   - no split brain: every acknowledged push of every client is in the final values exactly
#     once, in every group part.
#
#   test_replica_partition.sh PS_SERVER REPLICA_PUSHER
#
# Exit 77 (skipped) when not root, without network namespaces, or without etcd.
set -u
PS_SERVER=${1:?ps-server}
PUSHER=${2:?replica_pusher}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../support/netns.sh
. "$here/../support/netns.sh"
# shellcheck source=../support/procs.sh
. "$here/../support/procs.sh"
skip() {
    echo "SKIP: $*"
    exit 77
}
ETCD=${PSD_ETCD:-/usr/bin/etcd}
[ -x "$ETCD" ] || skip "no etcd at $ETCD (install Debian's etcd-server)"
reason=$(netns_skip_reason)
[ -z "$reason" ] || skip "network namespaces unavailable: $reason"
LEASE_MS=2000

tmp=$(mktemp -d /tmp/ps-test-replica-partition-XXXXXX)
data=$tmp/etcd
[ -w /dev/shm ] && data=$(mktemp -d /dev/shm/ps-test-replica-partition-XXXXXX)
at_exit() {
    netns_destroy
    [ "$data" = "$tmp/etcd" ] || rm -rf "$data"
}
procs_on_exit at_exit
now_ms() { date +%s%3N; }
# Acknowledgements in HISTORY files with a time in [FROM, TO) ms.
acks_between() {
    local from=$1 to=$2
    shift 2
    cat "$@" | awk -v a="$from" -v b="$to" '$1 == "ack" && $3 >= a && $3 < b { n++ } END { print n + 0 }'
}

# Hosts: 0 etcd, 1..3 ps 0..2, 4 the clients.
netns_create 5 || fail "cannot create the namespaces"
E=$(netns_addr 0)
coord="http://$E:2379"
spec="{\"ps\":[\"$(netns_addr 1):2222\",\"$(netns_addr 2):2222\",\"$(netns_addr 3):2222\"]}"
(netns_exec 0 "$ETCD" --data-dir "$data/d" --listen-client-urls "$coord" \
    --advertise-client-urls "$coord" --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster default=http://127.0.0.1:2380) >"$tmp/etcd.log" 2>&1 &
pids+=($!)
# Servers on separate hosts replicate with the admin token (REPLICATE is an admin method).
echo "partition-test-token" >"$tmp/admin-token"
ps=()
for i in 0 1 2; do
    (netns_exec $((i + 1)) "$PS_SERVER" --cluster "$spec" --task "ps:$i" --replicas 2 \
        --coordinator "$coord" --lease-ms $LEASE_MS --admin-token-file "$tmp/admin-token" --log-format text) 2>"$tmp/ps$i.log" &
    ps+=($!)
    pids+=($!)
done
for i in 0 1 2; do
    wait_log "$tmp/ps$i.log" "view epoch 1, primaries \[0 1 2\], live \[0 1 2\]" 30 ||
        fail "ps $i: no first view"
done
echo "ok   first view on every server"

clients=()
hist=()
for k in 0 1 2; do
    (netns_exec 4 "$PUSHER" push "$spec" part/v split $k 1300 "$tmp/hist$k" "$tmp/stop" 20) \
        2>"$tmp/client$k.log" &
    clients+=($!)
    pids+=($!)
    hist+=("$tmp/hist$k")
done
(netns_exec 2 "$PUSHER" push "$spec" part/iso group1 0 4096 "$tmp/histiso" "$tmp/stop" 10) \
    2>"$tmp/clientiso.log" &
iso=$!
pids+=($iso)
sleep 2
[ "$(acks_between 0 "$(now_ms)" "$tmp/histiso")" -gt 0 ] || fail "isolated client: no push acknowledged before the cut"

t_cut=$(now_ms)
netns_link 2 down # server 1 (host 2) and the isolated client
echo "     ps 1's cable cut"
wait_log "$tmp/ps1.log" "not renewed within its TTL" 6 || fail "ps 1 did not notice its lease"
wait_log "$tmp/ps0.log" "view epoch 2, primaries \[0 2 2\], live \[0 2\]" 10 ||
    fail "ps 0: no view without ps 1"
t_fo=$(now_ms)
echo "ok   the others took over group 1 (epoch 2) $((t_fo - t_cut)) ms after the cut"
wait_log "$tmp/ps2.log" "view epoch 2, primaries \[0 2 2\], live \[0 2\]" 3 ||
    fail "ps 2: no view without ps 1"
sleep 4
t_heal=$(now_ms)
for k in 0 1 2; do
    n=$(acks_between "$t_fo" "$t_heal" "${hist[$k]}")
    [ "$n" -gt 0 ] || fail "client $k (majority side): nothing acknowledged between the failover and the heal"
done
echo "ok   majority side: $(acks_between "$t_fo" "$t_heal" "${hist[@]}") pushes acknowledged between the failover and the heal"
grep -q "view epoch 2" "$tmp/ps1.log" && fail "ps 1 saw a view while cut off"
last=$(awk -v b="$t_heal" '$1 == "ack" && $3 < b { t = $3 } END { printf "%.0f", t }' "$tmp/histiso")
n=$(acks_between $((t_cut + LEASE_MS)) "$t_heal" "$tmp/histiso")
[ "$n" -eq 0 ] || fail "ps 1 acknowledged $n pushes more than its lease ($LEASE_MS ms) after the cut"
echo "ok   isolated primary: its last acknowledgement at cut + $((last - t_cut)) ms (lease $LEASE_MS ms), none later while cut off"

netns_link 2 up
echo "     cable back"
wait_log "$tmp/ps1.log" "lease lost" 10 || fail "ps 1 did not learn that its lease is gone"
wait_log "$tmp/ps0.log" "view epoch 3, primaries \[0 2 2\], live \[0 1 2\]" 30 ||
    fail "ps 1 did not rejoin (no view with it live)"
echo "ok   ps 1 rejoined: view epoch 3 with it live, $(($(now_ms) - t_heal)) ms after the heal"
wait_log "$tmp/histiso" "ack [0-9]* [0-9]*" 1 || true
sleep 1
n=$(acks_between "$t_heal" "$(now_ms)" "$tmp/histiso")
[ "$n" -gt 0 ] || fail "isolated client: nothing acknowledged after the heal"
echo "ok   isolated client: $n pushes acknowledged after the heal (group 1 now on ps 2)"

# Second cut: ps 2 (primary of groups 1 and 2 now, host 3) loses etcd only (iptables DROP both
# ways), still reaching its backups and the clients. Its lease expires, ps 0 and ps 1 take its
# groups over (epoch 4) and from then on refuse its stream (an older epoch): what it
# acknowledged before, its backups had applied; it acknowledges nothing after.
t_cut2=$(now_ms)
ip netns exec "$NETNS_PREFIX-h3" iptables -A INPUT -s "$E" -j DROP &&
    ip netns exec "$NETNS_PREFIX-h3" iptables -A OUTPUT -d "$E" -j DROP ||
    fail "iptables: cannot cut ps 2 from etcd"
echo "     ps 2 cut from etcd only"
wait_log "$tmp/ps0.log" "view epoch 4, primaries \[0 1 0\], live \[0 1\]" 10 ||
    fail "ps 0: no view without ps 2"
t_fo2=$(now_ms)
echo "ok   ps 0 and ps 1 took groups 1 and 2 over (epoch 4) $((t_fo2 - t_cut2)) ms after ps 2 lost etcd"
wait_log "$tmp/ps2.log" "streaming to backup .* refused: this server is at epoch 4" 5 ||
    fail "ps 2's backups do not refuse its stream"
sleep 3
t=$(now_ms)
for k in 0 1 2; do
    n=$(acks_between "$t_fo2" "$t" "${hist[$k]}")
    [ "$n" -gt 0 ] || fail "client $k: nothing acknowledged after ps 2 was replaced"
done
n=$(acks_between "$t_fo2" "$t" "$tmp/histiso")
[ "$n" -gt 0 ] || fail "isolated client: nothing acknowledged after ps 2 was replaced"
echo "ok   every client acknowledged again after ps 2 was replaced ($(acks_between "$t_fo2" "$t" "${hist[@]}" "$tmp/histiso") pushes)"
ip netns exec "$NETNS_PREFIX-h3" iptables -F INPUT
ip netns exec "$NETNS_PREFIX-h3" iptables -F OUTPUT
wait_log "$tmp/ps2.log" "lease lost" 10 || fail "ps 2 did not learn that its lease is gone"
wait_log "$tmp/ps0.log" "view epoch 5, primaries \[0 1 0\], live \[0 1 2\]" 30 ||
    fail "ps 2 did not rejoin (no view with it live)"
echo "ok   ps 2 rejoined: view epoch 5 with it live"
touch "$tmp/stop"
for k in 0 1 2; do
    wait_for "${clients[$k]}" 60 || fail "client $k failed (exit $?)"
done
wait_for "$iso" 60 || fail "isolated client failed (exit $?)"
out=$( (netns_exec 4 "$PUSHER" check "$spec" part/v split "${hist[@]}") 2>&1) ||
    fail "check: $out"
echo "ok   $out"
out=$( (netns_exec 4 "$PUSHER" check "$spec" part/iso group1 "$tmp/histiso") 2>&1) ||
    fail "check: $out"
echo "ok   $out"
for i in 0 1 2; do kill -0 "${ps[$i]}" 2>/dev/null || fail "ps $i died"; done
for i in 0 1 2; do kill -TERM "${ps[$i]}"; done
for i in 0 1 2; do wait_for "${ps[$i]}" 20 || fail "ps $i: exit $? on SIGTERM"; done
echo "ok   every server still ran, and exits 0 on SIGTERM"
