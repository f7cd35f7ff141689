#!/usr/bin/env bash
# Training throughput of ps-worker: aggregate samples/s of 1 and of 2 asynchronous workers
# (1 ps-server each time) on a local cluster, the 2-worker speed-up, and the time per step
# spent in communication. Optionally (--accuracy) also runs the main job and reports its test
# accuracy and wall time. Prints a markdown table for bench/RESULTS.md.
#
#   bench/train_bench.sh [--build-dir DIR] [--steps N] [--repeat R] [--cpus LIST]
#                        [--workers "1 2"] [--accuracy] [--] [extra ps-worker flags]
#
#   --steps N     steps per worker in a throughput run (default 2000)
#   --repeat R    runs per worker count; the median is reported (default 3)
#   --cpus LIST   pin the whole cluster to these CPUs with taskset (e.g. 0,1 for a 2-core
#                 machine on a bigger one); default: no pinning
#   --accuracy    also run the main job (default flags) once and report accuracy and wall time
#
# Aggregate samples/s = samples of all workers / the longest worker's training time (each
# worker's "trained ..." log line: data loading and connection set-up are excluded).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
steps=2000
repeat=3
cpus=""
counts="1 2"
accuracy=0
while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) build=$(realpath -m "$2"); shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --workers) counts=$2; shift 2 ;;
    --accuracy) accuracy=1; shift ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) break ;;
    esac
done
extra=("$@")

# shellcheck source=lib.sh
. "$root/bench/lib.sh"
bench_local train_bench
pin=()
if [ -n "$cpus" ]; then
    pin=(taskset -c "$cpus")
fi
tmp=$(mktemp -d /tmp/ps-train-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# One run; prints "aggregate_sps comm_ms compute_ms".
run_once() {
    local workers=$1 log="$tmp/run.log"
    bench_run train_bench "run with $workers worker(s)" "$tmp/run.out" "$log" \
        "${pin[@]}" "$local_bin" --workers "$workers" -- --steps "$steps" --log-format json \
        --log-every 1000000 --eval-every 1000000000 --model-name "bench_w$workers" "${extra[@]}"
    bench_trained "$log" | awk '{ print $1, $3, $4 }'
}

echo "| workers | aggregate samples/s (median of $repeat) | per worker | comm ms/step | compute ms/step | speed-up |"
echo "|---|---|---|---|---|---|"
base=""
for w in $counts; do
    : >"$tmp/results"
    for _ in $(seq "$repeat"); do
        run_once "$w" >>"$tmp/results"
    done
    sps=$(awk '{ print $1 }' "$tmp/results" | median)
    line=$(awk -v m="$sps" '$1 == m { print; exit }' "$tmp/results")
    comm=$(echo "$line" | awk '{ print $2 }')
    comp=$(echo "$line" | awk '{ print $3 }')
    [ -n "$base" ] || base=$sps
    awk -v w="$w" -v s="$sps" -v c="$comm" -v k="$comp" -v b="$base" \
        'BEGIN { printf "| %d | %.0f | %.0f | %.2f | %.2f | %.2fx |\n", w, s, s / w, c, k, s / b }'
done

if [ "$accuracy" -eq 1 ]; then
    start=$(date +%s.%N)
    "${pin[@]}" "$local_bin" --workers 2 -- --log-format json "${extra[@]}" \
        >"$tmp/main.out" 2>"$tmp/main.log" || { tail -n 20 "$tmp/main.log" >&2; exit 1; }
    end=$(date +%s.%N)
    echo
    echo "main job (1 ps, 2 workers, default flags${extra[*]:+ plus ${extra[*]}}):"
    echo "    $(grep test_accuracy= "$tmp/main.out")"
    awk -v a="$start" -v b="$end" 'BEGIN { printf "    wall time %.1f s (launch to exit)\n", b - a }'
fi
