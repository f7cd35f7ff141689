#!/usr/bin/env bash
# Separate hosts for real: 1 ps-server and 2 ps-worker processes, each in a network namespace of
# its own with its own address (10.77.X.1-3/24, veth pairs to a bridge in a further namespace;
# tests/support/netns.sh), cluster spec in TF_CONFIG with those addresses. Nothing goes over
# loopback and nothing is created in the test's own namespace.
#
#   test_netns.sh PS_SERVER PS_WORKER
#
#   (a) plain: the ps listens on its spec address (and not on 0.0.0.0 or 127.0.0.1: checked with
#       ss in its namespace); Fashion-MNIST, the MLP and epoch of test_train.sh, worker 0's test
#       accuracy >= 0.75.
#   (b) lossy and slow links: every host drops 2% of the packets it receives (iptables statistic
#       match) and the workers reach the ps through tests/support/delay_proxy.py (no netem in
#       this kernel), which adds 2 ms each way; the proxy must have carried both workers'
#       connections, each host's DROP rule must have dropped packets, the per-step
#       communication time must be at least one delayed round trip (4 ms), accuracy >= 0.75
#       (same model, 200 steps of 128 a worker).
#   (c) worker 1's cable (host 2) is cut (its port on the bridge set down) for 10 s mid-training, then
#       restored: both workers finish (exit 0), worker 1 ran all its steps, nobody was evicted
#       (--worker-timeout-ms 30000), worker 1 logged "waiting for ps 0 at tcp://ADDR" while cut,
#       and worker 0's accuracy >= 0.75.
#
# Exit 77 (skipped) when not root, when network namespaces or veth pairs are unavailable, when
# iptables or /usr/bin/python3 is missing, or when Fashion-MNIST is not installed. The
# namespaces (and with them the veths, the bridge, the iptables rules) and every process
# started here are removed on exit, whatever the outcome.
set -u
PS_SERVER=${1:?ps-server}
PS_WORKER=${2:?ps-worker}
DATA_DIR=${PS_TEST_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
here=$(cd "$(dirname "$0")" && pwd)
PROXY="$here/../support/delay_proxy.py"
# shellcheck source=../support/netns.sh
. "$here/../support/netns.sh"
# shellcheck source=../support/procs.sh
. "$here/../support/procs.sh"

skip() {
    echo "SKIP: $*"
    exit 77
}
if [ ! -r "$DATA_DIR/train-images-idx3-ubyte.gz" ] && [ ! -r "$DATA_DIR/train-images-idx3-ubyte" ]; then
    skip "Fashion-MNIST not found in $DATA_DIR (apt-get install dataset-fashion-mnist)"
fi
reason=$(netns_skip_reason)
[ -z "$reason" ] || skip "network namespaces unavailable: $reason"
command -v iptables >/dev/null 2>&1 || skip "iptables not installed (deploy/setup.sh installs it)"
command -v ss >/dev/null 2>&1 || skip "ss (iproute2) not installed"
[ -x /usr/bin/python3 ] || skip "/usr/bin/python3 not installed (needed by the delay proxy)"

tmp=$(mktemp -d /tmp/ps-test-netns-XXXXXX)
procs_on_exit netns_destroy

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

netns_create 3 || fail "could not create the namespaces"
A0=$(netns_addr 0) A1=$(netns_addr 1) A2=$(netns_addr 2)
echo "hosts: ps 0 $A0 ($NETNS_PREFIX-h0), worker 0 $A1, worker 1 $A2"

# tf TYPE INDEX PS_PORT: TF_CONFIG of a task; every task runs on port PS_PORT of its own host.
tf() {
    local port=$3
    echo "{\"cluster\":{\"ps\":[\"$A0:$port\"],\"worker\":[\"$A1:$port\",\"$A2:$port\"]},\"task\":{\"type\":\"$1\",\"index\":$2}}"
}

# start_server PORT NAME [ps-server flags]: ps 0 in host 0; waits until something listens on
# the port there. Sets $server.
start_server() {
    local port=$1 name=$2
    shift 2
    (TF_CONFIG=$(tf ps 0 "$port") netns_exec 0 "$PS_SERVER" --log-format json "$@") \
        >"$tmp/$name-ps.log" 2>&1 &
    server=$!
    pids+=("$server")
}

wait_listening() { # host addr:port seconds
    local _
    for _ in $(seq $(($3 * 10))); do
        ip netns exec "$NETNS_PREFIX-h$1" ss -Hltn 2>/dev/null | awk '{ print $4 }' | grep -qx "$2" &&
            return 0
        sleep 0.1
    done
    return 1
}

# start_worker INDEX PORT NAME [ps-worker flags]: worker INDEX in host INDEX+1. Sets $worker.
start_worker() {
    local i=$1 port=$2 name=$3
    shift 3
    (TF_CONFIG=$(tf worker "$i" "$port") netns_exec $((i + 1)) "$PS_WORKER" --log-format json \
        --data-dir "$DATA_DIR" "$@") >"$tmp/$name-w$i.out" 2>"$tmp/$name-w$i.log" &
    worker=$!
    pids+=("$worker")
}

stop_server() {
    kill -TERM "$server" 2>/dev/null
    wait_for "$server" 10
}

# The MLP and epoch of test_train.sh (accuracy >= 0.75 in one epoch of 2 workers).
train_args=(--layers "784,128,10" --epochs 1 --batch-size 64 --optimizer adam --seed 3
    --log-every 100)

# ---------------------------------------------------------------------------------------------
# (a) plain links
scenario_plain() {
    local port=2222 start rc0 rc1 acc w0 w1
    start_server "$port" plain
    wait_listening 0 "$A0:$port" 10 || fail "(a) ps-server does not listen on $A0:$port in its namespace"
    local socks
    socks=$(ip netns exec "$NETNS_PREFIX-h0" ss -Hltn | awk '{ print $4 }')
    echo "$socks" | grep -Eq '^(0\.0\.0\.0|127\.0\.0\.1|\*|\[::\]):' &&
        fail "(a) ps-server also listens on a wildcard or loopback address: $socks"
    start=$(date +%s.%N)
    start_worker 0 "$port" plain "${train_args[@]}" --model-name ns_plain
    w0=$worker
    start_worker 1 "$port" plain "${train_args[@]}" --model-name ns_plain
    w1=$worker
    wait_for "$w1" 60
    rc1=$?
    wait_for "$w0" 60
    rc0=$?
    local dt
    dt=$(elapsed "$start")
    stop_server
    [ "$rc0" -eq 0 ] || fail "(a) worker 0 exited $rc0"
    [ "$rc1" -eq 0 ] || fail "(a) worker 1 exited $rc1"
    acc=$(accuracy_of "$tmp/plain-w0.out")
    [ -n "$acc" ] || fail "(a) worker 0 printed no test_accuracy= line"
    echo "(a) plain: test accuracy $acc, $(field_of "$tmp/plain-w0.out" samples_per_s) samples/s (worker 0), comm $(field_of "$tmp/plain-w0.out" comm_ms_per_step) ms/step, $dt s"
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || fail "(a) test accuracy $acc < 0.75"
    grep -q '"samples_per_s"' "$tmp/plain-w1.log" || fail "(a) worker 1 logged no samples_per_s"
}

# ---------------------------------------------------------------------------------------------
# (b) 2% loss on every host, 2 ms each way through the proxy
scenario_lossy() {
    local port=2232 inner=2233 start rc0 rc1 acc w0 w1 i proxy
    for i in 0 1 2; do
        netns_loss "$i" 2 || fail "(b) iptables rule in host $i failed"
    done
    start_server "$port" lossy --listen "tcp://$A0:$inner"
    wait_listening 0 "$A0:$inner" 10 || fail "(b) ps-server does not listen on $A0:$inner"
    (netns_exec 0 /usr/bin/python3 "$PROXY" "$A0:$port" "$A0:$inner" 2) \
        >"$tmp/lossy-proxy.out" 2>"$tmp/lossy-proxy.log" &
    proxy=$!
    pids+=("$proxy")
    wait_listening 0 "$A0:$port" 10 || fail "(b) the delay proxy does not listen on $A0:$port"
    start=$(date +%s.%N)
    # Every step pays several delayed round trips and the loss's retransmissions: fewer,
    # larger steps than (a) (same model, batch 128, 200 steps a worker; ~0.82 in 2 runs).
    local args=(--layers "784,128,10" --batch-size 128 --steps 200 --optimizer adam --seed 3
        --log-every 50 --model-name ns_lossy)
    start_worker 0 "$port" lossy "${args[@]}"
    w0=$worker
    start_worker 1 "$port" lossy "${args[@]}"
    w1=$worker
    wait_for "$w1" 90
    rc1=$?
    wait_for "$w0" 90
    rc0=$?
    local dt
    dt=$(elapsed "$start")
    stop_server
    kill -TERM "$proxy" 2>/dev/null
    wait_for "$proxy" 5
    local drops=() d
    for i in 0 1 2; do
        d=$(ip netns exec "$NETNS_PREFIX-h$i" iptables -L INPUT -v -n -x | awk '$3 == "DROP" { print $1 }')
        drops+=("${d:-0}")
        netns_loss "$i" 0
    done
    [ "$rc0" -eq 0 ] || fail "(b) worker 0 exited $rc0"
    [ "$rc1" -eq 0 ] || fail "(b) worker 1 exited $rc1"
    acc=$(accuracy_of "$tmp/lossy-w0.out")
    [ -n "$acc" ] || fail "(b) worker 0 printed no test_accuracy= line"
    local comm
    comm=$(field_of "$tmp/lossy-w0.out" comm_ms_per_step)
    echo "(b) 2% loss, +2 ms each way: test accuracy $acc, $(field_of "$tmp/lossy-w0.out" samples_per_s) samples/s (worker 0), comm $comm ms/step, $dt s; packets dropped by ps/w0/w1: ${drops[*]}"
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || fail "(b) test accuracy $acc < 0.75"
    for i in 0 1 2; do
        [ "${drops[$i]}" -gt 0 ] || fail "(b) host $i dropped no packet: the loss rule did not act"
    done
    grep -q "connection from $A1:" "$tmp/lossy-proxy.log" || fail "(b) worker 0 did not go through the proxy"
    grep -q "connection from $A2:" "$tmp/lossy-proxy.log" || fail "(b) worker 1 did not go through the proxy"
    awk -v c="$comm" 'BEGIN { exit !(c >= 4) }' ||
        fail "(b) $comm ms of communication per step, less than one delayed round trip (4 ms)"
}

# ---------------------------------------------------------------------------------------------
# (c) worker 1's cable cut for 10 s mid-training
scenario_cut() {
    local port=2242 rc0 rc1 acc w0 w1 steps=300 cut
    start_server "$port" cut --worker-timeout-ms 30000
    wait_listening 0 "$A0:$port" 10 || fail "(c) ps-server does not listen on $A0:$port"
    local args=(--layers "784,64,10" --batch-size 128 --optimizer adam --seed 3 --log-every 10
        --steps "$steps" --slow-worker 1 --slow-delay-ms 10 --model-name ns_cut)
    start_worker 0 "$port" cut "${args[@]}"
    w0=$worker
    start_worker 1 "$port" cut "${args[@]}"
    w1=$worker
    wait_log "$tmp/cut-w1.log" '"step":30,' 30 || fail "(c) worker 1 never logged step 30"
    netns_link 2 down || fail "(c) could not cut worker 1's link"
    cut=$(date +%s.%N)
    sleep 10
    netns_link 2 up || fail "(c) could not restore worker 1's link"
    echo "(c) worker 1's link was down for $(elapsed "$cut") s"
    local restored
    restored=$(date +%s.%N)
    wait_for "$w1" 60
    rc1=$?
    wait_for "$w0" 60
    rc0=$?
    local dt
    dt=$(elapsed "$restored")
    stop_server
    [ "$rc1" -eq 0 ] || fail "(c) worker 1 exited $rc1"
    [ "$rc0" -eq 0 ] || fail "(c) worker 0 exited $rc0"
    # json-c may write "/" as "\/": accept both.
    local waiting
    waiting=$(grep -o "waiting for ps 0 at tcp:\\\\\\?/\\\\\\?/$A0:$port: [^\"]*" "$tmp/cut-w1.log" | head -n 1)
    [ -n "$waiting" ] || fail "(c) worker 1 did not log 'waiting for ps 0 at tcp://$A0:$port'"
    grep -q "evicted" "$tmp/cut-ps.log" && fail "(c) the server evicted a worker"
    grep -q "\"step\":$steps," "$tmp/cut-w1.log" || fail "(c) worker 1 did not reach step $steps"
    acc=$(accuracy_of "$tmp/cut-w0.out")
    [ -n "$acc" ] || fail "(c) worker 0 printed no test_accuracy= line"
    echo "(c) worker 1 logged: $waiting"
    echo "(c) both finished $dt s after the link came back; test accuracy $acc"
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || fail "(c) test accuracy $acc < 0.75"
}

scenario_plain
scenario_lossy
scenario_cut
echo "PASS"
