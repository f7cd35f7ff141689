#!/usr/bin/env bash
# Training over separate network namespaces against loopback: 1 ps-server and 2 asynchronous
# ps-worker processes train the MLP of tests/integration/test_train.sh (784,128,10, batch 64,
# one epoch of Fashion-MNIST, adam) in several network set-ups, the set-ups alternating within
# each round so that the machine's load drifts over all of them alike. Prints a markdown table
# (medians over the rounds) for bench/RESULTS.md and one line per run on stderr.
#
#   sudo bench/netns_bench.sh [--build-dir DIR] [--repeat R] [--setups "loopback netns ..."]
#                             [--] [extra ps-worker flags]
#
#   loopback       all three processes in the caller's namespace on 127.0.0.1
#   netns          each process in a namespace of its own (10.77.X.1-3, veths to a bridge;
#                  tests/support/netns.sh)
#   proxy0         netns, the workers reach the ps through tests/support/delay_proxy.py with no
#                  delay (what the user-space proxy itself costs)
#   delay2         netns, through the proxy with 2 ms each way
#   loss2          netns, every host drops 2% of the packets it receives (iptables statistic)
#   loss2+delay2   both (scenario (b) of tests/integration/test_netns.sh)
#
# Aggregate samples/s = samples of both workers / the longer worker's training time (the
# "trained ..." log lines: data loading and connection set-up excluded); time = start of the
# workers to the exit of both (includes data loading and the final evaluation).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
repeat=2
setups="loopback netns proxy0 delay2 loss2 loss2+delay2"
while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) build=$(realpath -m "$2"); shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --setups) setups=$2; shift 2 ;;
    -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) break ;;
    esac
done
extra=("$@")
DATA_DIR=${PS_TEST_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
PS_SERVER="$build/server/ps-server"
PS_WORKER="$build/worker/ps-worker"
PS_LOCAL="$build/deploy/local/ps-local"
PROXY="$root/tests/support/delay_proxy.py"
for b in "$PS_SERVER" "$PS_WORKER" "$PS_LOCAL"; do
    [ -x "$b" ] || { echo "netns_bench: $b not built (meson compile -C $build)" >&2; exit 2; }
done
# shellcheck source=../tests/support/netns.sh
. "$root/tests/support/netns.sh"
# shellcheck source=../tests/support/procs.sh
. "$root/tests/support/procs.sh"
reason=$(netns_skip_reason)
[ -z "$reason" ] || { echo "netns_bench: network namespaces unavailable: $reason" >&2; exit 2; }
command -v iptables >/dev/null || { echo "netns_bench: iptables not installed" >&2; exit 2; }

tmp=$(mktemp -d /tmp/ps-netns-bench-XXXXXX)
procs_on_exit netns_destroy
netns_create 3 || { echo "netns_bench: could not create the namespaces" >&2; exit 1; }

args=(--layers "784,128,10" --epochs 1 --batch-size 64 --optimizer adam --seed 3
    --log-every 1000000 --log-format json --data-dir "$DATA_DIR" "${extra[@]}")

# run_once SETUP N: writes "samples_per_s time_s accuracy comm_ms_per_step(worker 0)" to
# $tmp/result.
run_once() {
    local setup=$1 n=$2 a0 a1 a2 ps_port listen=() loss=0 delay="" p
    local port=$((3000 + 10 * n))
    ps_port=$port
    if [ "$setup" = loopback ]; then
        mapfile -t p < <("$PS_LOCAL" --print-ports 3)
        a0=127.0.0.1 a1=127.0.0.1 a2=127.0.0.1
        ps_port=${p[0]}
        local w_ports=("${p[1]}" "${p[2]}")
    else
        a0=$(netns_addr 0) a1=$(netns_addr 1) a2=$(netns_addr 2)
        local w_ports=("$port" "$port")
        case "$setup" in
        netns) ;;
        proxy0) delay=0 ;;
        delay2) delay=2 ;;
        loss2) loss=2 ;;
        loss2+delay2) loss=2 delay=2 ;;
        *) echo "netns_bench: unknown set-up $setup" >&2; exit 2 ;;
        esac
    fi
    local cluster="{\"ps\":[\"$a0:$ps_port\"],\"worker\":[\"$a1:${w_ports[0]}\",\"$a2:${w_ports[1]}\"]}"
    in_host() { # I CMD...: CMD in host I (or here, on loopback)
        local i=$1
        shift
        if [ "$setup" = loopback ]; then exec "$@"; else netns_exec "$i" "$@"; fi
    }
    local i
    for i in 0 1 2; do
        [ "$setup" = loopback ] || netns_loss "$i" "$loss" || exit 1
    done
    if [ -n "$delay" ]; then
        listen=(--listen "tcp://$a0:$((ps_port + 1))")
        (in_host 0 /usr/bin/python3 "$PROXY" "$a0:$ps_port" "$a0:$((ps_port + 1))" "$delay") \
            >/dev/null 2>"$tmp/proxy.log" &
        pids+=($!)
        local proxy=$!
    fi
    (TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"ps\",\"index\":0}}" \
        in_host 0 "$PS_SERVER" --log-format json "${listen[@]}") >"$tmp/ps.log" 2>&1 &
    local server=$!
    pids+=("$server")
    sleep 0.5
    local start w=()
    start=$(date +%s.%N)
    for i in 0 1; do
        (TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":$i}}" \
            in_host $((i + 1)) "$PS_WORKER" "${args[@]}" --model-name "nb_$n") \
            >"$tmp/w$i.out" 2>"$tmp/w$i.log" &
        w+=($!)
        pids+=($!)
    done
    local rc=0
    for i in 0 1; do
        wait "${w[$i]}" || rc=$?
    done
    local dt
    dt=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    kill -TERM "$server" 2>/dev/null
    wait "$server" 2>/dev/null
    if [ -n "$delay" ]; then
        kill -TERM "$proxy" 2>/dev/null
        wait "$proxy" 2>/dev/null
    fi
    if [ "$rc" -ne 0 ]; then
        echo "netns_bench: $setup: a worker exited $rc" >&2
        tail -n 5 "$tmp"/w*.log >&2
        exit 1
    fi
    local sps acc comm
    sps=$(cat "$tmp/w0.log" "$tmp/w1.log" | grep -o '"msg":"trained [^}]*' |
        sed 's/.*"samples":\([0-9]*\),"wall_s":\([0-9.]*\).*/\1 \2/' |
        awk '{ s += $1; if ($2 > m) m = $2 } END { printf "%.0f", s / m }')
    acc=$(accuracy_of "$tmp/w0.out")
    comm=$(field_of "$tmp/w0.out" comm_ms_per_step)
    echo "$sps $dt $acc $comm" >"$tmp/result"
}

declare -A results
n=0
for ((r = 1; r <= repeat; r++)); do
    for s in $setups; do
        n=$((n + 1))
        run_once "$s" "$n"
        line=$(cat "$tmp/result")
        echo "round $r $s: samples/s time_s accuracy comm_ms/step = $line" >&2
        results[$s]+="$line"$'\n'
    done
done

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "| set-up | samples/s (both workers) | time, s | test accuracy | comm ms/step (worker 0) | runs |"
echo "|---|---|---|---|---|---|"
for s in $setups; do
    col() { printf '%s' "${results[$s]}" | awk -v c="$1" 'NF { print $c }' | median; }
    all=$(printf '%s' "${results[$s]}" | awk 'NF { printf "%s%s", sep, $1; sep = ", " }')
    echo "| $s | $(col 1) ($all) | $(col 2) | $(col 3) | $(col 4) | $repeat |"
done
