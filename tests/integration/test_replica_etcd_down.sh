#!/usr/bin/env bash
# etcd killed under a replicated cluster that trains: 3 ps-servers (replicas 2, lease 2 s) and
# 3 client processes pushing identifiable gradients (tests/integration/replica_pusher.c) to a
# variable split over every group.
#   - etcd SIGKILLed: pushes go on being acknowledged on the current view for longer than a
#     lease, and every server logs "failover waits for etcd" with the cause;
#   - ps 1 (primary of group 1) SIGKILLed while etcd is down: no server installs a view without
#     it (no failover without etcd), pushes wait;
#   - etcd restarted on the same data: the view without ps 1 is installed within a few leases
#     and pushes are acknowledged again;
#   - every acknowledged push is in the final values exactly once, in every group.
#
#   test_replica_etcd_down.sh PS_SERVER REPLICA_PUSHER
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
tmp=$(mktemp -d /tmp/ps-test-etcd-down-XXXXXX)
data=$tmp/etcd
[ -w /dev/shm ] && data=$(mktemp -d /dev/shm/ps-test-etcd-down-XXXXXX)
at_exit() { [ "$data" = "$tmp/etcd" ] || rm -rf "$data"; }
procs_on_exit at_exit
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now_ms() { date +%s%3N; }
# Acknowledgements in HISTORY files with a time in [FROM, TO) ms.
acks_between() {
    local from=$1 to=$2
    shift 2
    cat "$@" | awk -v a="$from" -v b="$to" '$1 == "ack" && $3 >= a && $3 < b { n++ } END { print n + 0 }'
}

cp=$(port)
pp=$(port)
coord="http://127.0.0.1:$cp"
start_etcd() {
    "$ETCD" --data-dir "$data/d" --listen-client-urls "$coord" --advertise-client-urls "$coord" \
        --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
        --initial-cluster "default=http://127.0.0.1:$pp" >>"$tmp/etcd.log" 2>&1 &
    etcd_pid=$!
    pids+=($etcd_pid)
}
start_etcd
ports=($(port) $(port) $(port))
spec="{\"ps\":[\"127.0.0.1:${ports[0]}\",\"127.0.0.1:${ports[1]}\",\"127.0.0.1:${ports[2]}\"]}"
ps=()
for i in 0 1 2; do
    "$PS_SERVER" --cluster "$spec" --task "ps:$i" --replicas 2 --coordinator "$coord" \
        --log-format text 2>"$tmp/ps$i.log" &
    ps+=($!)
    pids+=($!)
done
for i in 0 1 2; do
    wait_log "$tmp/ps$i.log" "view epoch 1, primaries \[0 1 2\], live \[0 1 2\]" 30 ||
        fail "ps $i: no first view"
done
echo "ok   first view on every server"

clients=()
for k in 0 1 2; do
    "$PUSHER" push "$spec" ed/v split $k 1300 "$tmp/hist$k" "$tmp/stop" 10 2>"$tmp/client$k.log" &
    clients+=($!)
    pids+=($!)
done
hist=("$tmp/hist0" "$tmp/hist1" "$tmp/hist2")
sleep 2
t_etcd=$(now_ms)
kill -KILL "$etcd_pid"
echo "     etcd SIGKILLed"
sleep 4
t=$(now_ms)
for k in 0 1 2; do
    n=$(acks_between $((t_etcd + 3000)) "$t" "${hist[$k]}")
    [ "$n" -gt 0 ] || fail "client $k: no push acknowledged from 3 s after etcd died (lease 2 s)"
done
n=$(acks_between "$t_etcd" "$t" "${hist[@]}")
echo "ok   etcd down: $n pushes acknowledged in the $(((t - t_etcd) / 1000)) s after, on every client, past the lease"
for i in 0 1 2; do
    grep -q "failover waits for etcd: .*etcd unreachable" \
        "$tmp/ps$i.log" || fail "ps $i does not say that failover waits for etcd, and why"
    grep -q "view epoch 2" "$tmp/ps$i.log" && fail "ps $i: a new view while etcd is down"
done
grep -h "failover waits for etcd" "$tmp/ps0.log" | head -n 1 | sed 's/^/     ps 0: /'
echo "ok   every server logs that failover waits for etcd, with the cause"

t_kill=$(now_ms)
kill -KILL "${ps[1]}"
echo "     ps 1 (primary of group 1) SIGKILLed while etcd is down"
sleep 5
t=$(now_ms)
for i in 0 2; do
    grep -q "view epoch 2" "$tmp/ps$i.log" && fail "ps $i failed over while etcd was down"
    kill -0 "${ps[$i]}" 2>/dev/null || fail "ps $i died"
done
n=$(acks_between $((t_kill + 1000)) "$t" "${hist[@]}")
[ "$n" -eq 0 ] || fail "$n pushes acknowledged from 1 s after the kill, without group 1's primary"
echo "ok   no failover while etcd is down (5 s, 2.5 leases): pushes wait"

t_up=$(now_ms)
start_etcd
for i in 0 2; do
    # Epoch 2, or 3 when ps 0 first took the dead ps 1 out of sync in group 0 (its stream
    # failed for two leases and 5 s) before etcd expired ps 1's lease.
    wait_log "$tmp/ps$i.log" "view epoch [23], primaries \[0 2 2\], live \[0 2\]" 20 ||
        fail "ps $i: no failover once etcd is back"
done
t_fo=$(now_ms)
echo "ok   etcd back: failover to ps 2 $((t_fo - t_up)) ms after etcd's restart"
grep -q "etcd answers again" "$tmp/ps0.log" || fail "ps 0 does not say etcd answers again"
sleep 2
t=$(now_ms)
for k in 0 1 2; do
    n=$(acks_between "$t_up" "$t" "${hist[$k]}")
    [ "$n" -gt 0 ] || fail "client $k: no push acknowledged after the failover"
done
echo "ok   pushes acknowledged again after the failover"
touch "$tmp/stop"
for k in 0 1 2; do
    wait_for "${clients[$k]}" 60 || fail "client $k failed (exit $?)"
done
out=$("$PUSHER" check "$spec" ed/v split "${hist[@]}" 2>&1) || fail "check: $out"
echo "ok   $out"
for i in 0 2; do kill -TERM "${ps[$i]}"; done
for i in 0 2; do wait_for "${ps[$i]}" 20 || fail "ps $i: exit $? on SIGTERM"; done
echo "ok   ps 0 and ps 2 exit 0 on SIGTERM"
