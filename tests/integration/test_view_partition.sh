#!/usr/bin/env bash
# A replicated cluster cut in two for real: etcd and 3 ps-servers (replicas 2), each in a network
# namespace of its own (tests/support/netns.sh). Server 1's cable is cut:
#   - server 1, cut off from etcd, says within its lease that its lease was not renewed in time
#     (the event that stops it acknowledging alone);
#   - the others install the view without it (group 1's primary moves to server 2, one epoch
#     bump) about one lease after the cut;
#   - once the cable is back, server 1 learns from etcd that its lease is gone ("lease lost")
#     and registers again as a new incarnation.
#
#   test_view_partition.sh PS_SERVER
#
# Exit 77 (skipped) when not root, without network namespaces, or without etcd.
set -u
PS_SERVER=${1:?ps-server}
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

tmp=$(mktemp -d /tmp/ps-test-view-partition-XXXXXX)
# etcd's data on tmpfs when there is one (fsyncs on a busy disk stall it for seconds).
data=$tmp/etcd
[ -w /dev/shm ] && data=$(mktemp -d /dev/shm/ps-test-view-partition-XXXXXX)
at_exit() {
    netns_destroy
    [ "$data" = "$tmp/etcd" ] || rm -rf "$data"
}
procs_on_exit at_exit
netns_create 4 || fail "cannot create the namespaces"
E=$(netns_addr 0)
coord="http://$E:2379"
spec="{\"ps\":[\"$(netns_addr 1):2222\",\"$(netns_addr 2):2222\",\"$(netns_addr 3):2222\"]}"
(netns_exec 0 "$ETCD" --data-dir "$data/d" --listen-client-urls "$coord" \
    --advertise-client-urls "$coord" --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster default=http://127.0.0.1:2380) >"$tmp/etcd.log" 2>&1 &
pids+=($!)
# Servers on separate addresses replicate with admin calls: one token for all of them.
echo "partition-test-token" >"$tmp/token"
for i in 0 1 2; do
    (netns_exec $((i + 1)) "$PS_SERVER" --cluster "$spec" --task "ps:$i" --replicas 2 \
        --coordinator "$coord" --admin-token-file "$tmp/token" --log-format text) \
        2>"$tmp/ps$i.log" &
    pids+=($!)
done
for i in 0 1 2; do
    wait_log "$tmp/ps$i.log" "view epoch 1, primaries \[0 1 2\], live \[0 1 2\]" 30 ||
        fail "ps $i: no first view"
done
echo "ok   first view on every server"

t0=$(date +%s%N)
netns_link 2 down # server 1 (host 2)
wait_log "$tmp/ps1.log" "not renewed within its TTL" 6 || fail "ps 1 did not notice its lease"
ms=$((($(date +%s%N) - t0) / 1000000))
echo "ok   ps 1, cut off, says its lease was not renewed in time ($ms ms after the cut)"
[ $ms -le 3500 ] || fail "ps 1 noticed only after $ms ms (lease 2000 ms)"
wait_log "$tmp/ps0.log" "view epoch 2, primaries \[0 2 2\], live \[0 2\]" 8 ||
    fail "ps 0: no view without ps 1"
ms=$((($(date +%s%N) - t0) / 1000000))
echo "ok   the others dropped ps 1 ($ms ms after the cut)"
wait_log "$tmp/ps2.log" "view epoch 2, primaries \[0 2 2\], live \[0 2\]" 3 ||
    fail "ps 2: no view without ps 1"
grep -q "view epoch 3" "$tmp/ps0.log" && fail "more than one epoch bump for one cut"
grep -q "view epoch 2" "$tmp/ps1.log" && fail "ps 1 saw a view while cut off"

netns_link 2 up
wait_log "$tmp/ps1.log" "lease lost" 8 || fail "ps 1 did not learn that its lease is gone"
wait_log "$tmp/ps1.log" "view epoch 2, primaries \[0 2 2\], live \[0 2\]" 5 ||
    fail "ps 1 did not learn the view without it"
n=$(grep -c "registered in etcd" "$tmp/ps1.log")
[ "$n" -ge 2 ] || fail "ps 1 did not register again (registered $n times)"
echo "ok   back on the network, ps 1 learns its lease is gone and registers again"
for i in 0 1 2; do kill -0 "${pids[$((i + 1))]}" 2>/dev/null || fail "ps $i died"; done
echo "ok   every server still runs"
