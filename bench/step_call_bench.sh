#!/usr/bin/env bash
# The main job's shape (784-256-128-10, batch 128, Adam, 1 ps) trained with one Step request
# per server per step (ps-worker's default, --step-call) against one call per variable plus a
# clock (--step-call=false, fused push-pull), in the same run, runs alternating; and both
# against the model's math alone on one core (ps-step-bench --device cpu), so that the ratio
# survives a noisy machine. Prints a markdown table for bench/RESULTS.md.
#
#   bench/step_call_bench.sh [--build-dir DIR] [--steps N] [--repeat R] [--workers "1 2"]
#                            [--] [extra ps-worker flags]
#
# Per cell: the median of R runs of aggregate samples/s (all workers' samples / the longest
# worker's training time), with that run's context switches per worker step (getrusage of
# each ps-worker over its training loop: all of its threads).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
steps=2000
repeat=3
counts="1 2"
while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) build=$(realpath -m "$2"); shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --workers) counts=$2; shift 2 ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) break ;;
    esac
done
extra=("$@")

# shellcheck source=lib.sh
. "$root/bench/lib.sh"
bench_local step_call_bench
step_bin="$build/worker/ps-step-bench"
tmp=$(mktemp -d /tmp/ps-step-call-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# One training run; prints "aggregate_sps context_switches_per_worker_step".
run_once() {
    local workers=$1 mode=$2 log="$tmp/run.log"
    bench_run step_call_bench "run with $workers worker(s), step-call=$mode" "$tmp/run.out" \
        "$log" "$local_bin" --workers "$workers" -- --steps "$steps" --optimizer adam \
        --batch-size 128 --log-format json --log-every 1000000 --eval-every 1000000000 \
        --model-name "scb_${mode}_$workers" --step-call="$mode" "${extra[@]}"
    local sps csw
    sps=$(bench_trained "$log" | awk '{ print $1 }')
    csw=$(grep '"msg":"trained ' "$log" |
        sed -n 's/.*"context_switches_per_step":\([0-9.]*\).*/\1/p' |
        awk '{ s += $1; n++ } END { printf "%.1f", n ? s / n : 0 }')
    echo "$sps $csw"
}

# The model's step alone on the CPU backend, one thread: samples/s of its "step" line.
math_rate() {
    "$step_bin" --device cpu --layers 784,256,128,10 --batch 128 --seconds 2 2>/dev/null |
        awk '$1 == "step" { print $3 }'
}

: >"$tmp/math"
for w in $counts; do
    for mode in false true; do
        : >"$tmp/r_${w}_$mode"
    done
done
for _ in $(seq "$repeat"); do
    math_rate >>"$tmp/math"
    for w in $counts; do
        for mode in false true; do
            run_once "$w" "$mode" >>"$tmp/r_${w}_$mode"
        done
    done
done
math=$(median <"$tmp/math")
echo "model math alone (ps-step-bench --device cpu, median of $repeat): $math samples/s"
echo
echo "| workers | calls per step | aggregate samples/s (median of $repeat) | / math alone | context switches per worker step |"
echo "|---|---|---|---|---|"
for w in $counts; do
    for mode in false true; do
        f="$tmp/r_${w}_$mode"
        sps=$(awk '{ print $1 }' "$f" | median)
        csw=$(awk -v m="$sps" '$1 == m { print $2; exit }' "$f")
        label="one per variable + clock"
        [ "$mode" = true ] && label="one Step per server"
        awk -v w="$w" -v l="$label" -v s="$sps" -v m="$math" -v c="$csw" \
            'BEGIN { printf "| %d | %s | %.0f | %.2f | %s |\n", w, l, s, s / m, c }'
    done
done
echo
echo "runs (aggregate samples/s, context switches per step):"
for w in $counts; do
    for mode in false true; do
        echo "  workers $w step-call=$mode: $(tr '\n' ';' <"$tmp/r_${w}_$mode")"
    done
done
echo "  math alone: $(tr '\n' ' ' <"$tmp/math")"
