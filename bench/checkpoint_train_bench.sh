#!/usr/bin/env bash
# Training throughput with periodic server checkpoints against none: ps-local with 1 ps-server
# and 2 asynchronous ps-workers, runs with `--checkpoint-dir DIR --checkpoint-interval-s S`
# interleaved with runs without a checkpoint directory, and the ratio of the medians. Prints a
# markdown table for bench/RESULTS.md.
#
#   bench/checkpoint_train_bench.sh [--build-dir DIR] [--steps N] [--repeat R] [--interval S]
#                                   [--ps N] [--workers N] [--dir DIR] [--] [ps-worker flags]
#
#   --steps N      steps per worker in a run (default 5000: about 30 s on a 2-core VM with the
#                  default model); a run must last several checkpoint intervals
#   --repeat R     runs of each kind, interleaved (default 3)
#   --interval S   --checkpoint-interval-s of the runs with checkpoints (default 10)
#   --dir DIR      checkpoint directory (default: a new directory under /tmp, removed at exit)
#
# Aggregate samples/s = samples of all workers / the longest worker's training time (each
# worker's "trained ..." log line: data loading and connection set-up are excluded). The
# checkpoints column counts the "checkpoint ..." lines of the servers during the run (the one
# written when ps-local stops the servers included).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
steps=5000
repeat=3
interval=10
nps=1
workers=2
ckdir=""
while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) build=$(realpath -m "$2"); shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --ps) nps=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --dir) ckdir=$(realpath -m "$2"); shift 2 ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) break ;;
    esac
done
extra=("$@")

# shellcheck source=lib.sh
. "$root/bench/lib.sh"
bench_local checkpoint_train_bench
tmp=$(mktemp -d /tmp/ps-ckpt-train-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
[ -n "$ckdir" ] || ckdir="$tmp/ckpt-dir"

# One run; $1 is "none" or "ckpt". Prints "aggregate_sps wall_s checkpoints".
run_once() {
    local kind=$1 n=$2 log="$tmp/run.log"
    local server_args=()
    if [ "$kind" = ckpt ]; then
        rm -rf "$ckdir"
        mkdir -p "$ckdir"
        server_args=(--server-arg=--checkpoint-dir="$ckdir"
            --server-arg=--checkpoint-interval-s="$interval")
    fi
    bench_run checkpoint_train_bench "$kind run" "$tmp/run.out" "$log" \
        "$local_bin" --ps "$nps" --workers "$workers" "${server_args[@]}" -- --steps "$steps" \
        --log-format json --log-every 1000000 --eval-every 1000000000 \
        --model-name "ckbench_${kind}_$n" "${extra[@]}"
    local ckpts
    ckpts=$(grep -c '"role":"ps".*"msg":"checkpoint ' "$log" || true)
    echo "$(bench_trained "$log" | awk '{ print $1, $2 }') $ckpts"
}

echo "$nps ps, $workers workers, $steps steps per worker, checkpoint every $interval s" \
    "(${extra[*]:-default model})"
echo
echo "| run | no checkpoints: samples/s (s) | checkpoint every ${interval} s: samples/s (s) | checkpoints | ratio |"
echo "|---|---|---|---|---|"
: >"$tmp/none"
: >"$tmp/ckpt"
for r in $(seq "$repeat"); do
    # Alternate which kind goes first so that a drift of the machine hits both alike.
    if [ $((r % 2)) -eq 1 ]; then
        a=$(run_once none "$r")
        b=$(run_once ckpt "$r")
    else
        b=$(run_once ckpt "$r")
        a=$(run_once none "$r")
    fi
    echo "$a" >>"$tmp/none"
    echo "$b" >>"$tmp/ckpt"
    awk -v r="$r" -v a="$a" -v b="$b" 'BEGIN {
        split(a, x, " "); split(b, y, " ")
        printf "| %d | %.0f (%.1f) | %.0f (%.1f) | %d | %.3fx |\n", r, x[1], x[2], y[1], y[2], y[3],
            y[1] / x[1]
    }'
done
mn=$(awk '{ print $1 }' "$tmp/none" | median)
mc=$(awk '{ print $1 }' "$tmp/ckpt" | median)
awk -v a="$mn" -v b="$mc" 'BEGIN {
    printf "| median | %.0f | %.0f | | %.3fx |\n", a, b, b / a
}'
