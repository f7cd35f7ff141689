#!/usr/bin/env bash
# The bfloat16 wire (client setting wire-dtype) against float32, runs alternating: the wide
# MLP's (784-4096-4096-10, Adam, 1 worker, 1 ps) time per step and its part in communication,
# and the main job's test accuracy (1 ps, 2 workers, default flags). Prints a markdown table
# for bench/RESULTS.md.
#
#   bench/wire_dtype_bench.sh [--build-dir DIR] [--repeat R] [--wide-steps N] [--no-accuracy]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
repeat=3
wide_steps=20
accuracy=1
while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) build=$(realpath -m "$2"); shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --wide-steps) wide_steps=$2; shift 2 ;;
    --no-accuracy) accuracy=0; shift ;;
    -h | --help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "wire_dtype_bench: unknown argument $1" >&2; exit 2 ;;
    esac
done

# shellcheck source=lib.sh
. "$root/bench/lib.sh"
bench_local wire_dtype_bench
tmp=$(mktemp -d /tmp/ps-wire-dtype-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

for d in float32 bfloat16; do
    : >"$tmp/wide_$d"
    : >"$tmp/acc_$d"
done
for r in $(seq "$repeat"); do
    for d in float32 bfloat16; do
        bench_run wire_dtype_bench "wide MLP, $d" "$tmp/out" "$tmp/log" "$local_bin" --workers 1 \
            -- --layers 784,4096,4096,10 --steps "$wide_steps" --optimizer adam \
            --log-format json --log-every 1000000 --eval-every 1000000000 \
            --model-name "wide_${d}_$r" --wire-dtype "$d"
        # samples/s, ms per step, communication ms per step
        bench_trained "$tmp/log" |
            awk -v b=128 '{ printf "%.1f %.1f %.1f\n", $1, b / $1 * 1000, $3 }' >>"$tmp/wide_$d"
    done
    if [ "$accuracy" = 1 ]; then
        for d in float32 bfloat16; do
            bench_run wire_dtype_bench "main job, $d" "$tmp/out" "$tmp/log" "$local_bin" \
                --workers 2 -- --log-format json --model-name "acc_${d}_$r" --wire-dtype "$d"
            sed -n 's/^test_accuracy=\([0-9.]*\).*/\1/p' "$tmp/out" >>"$tmp/acc_$d"
        done
    fi
done

echo "| wire | wide MLP ms/step (median of $repeat) | of which communication | samples/s | main job test accuracy (runs) |"
echo "|---|---|---|---|---|"
for d in float32 bfloat16; do
    ms=$(awk '{ print $2 }' "$tmp/wide_$d" | median)
    line=$(awk -v m="$ms" '$2 == m { print; exit }' "$tmp/wide_$d")
    acc="-"
    [ "$accuracy" = 1 ] && acc=$(tr '\n' ' ' <"$tmp/acc_$d")
    echo "$line" | awk -v d="$d" -v a="$acc" '{ printf "| %s | %.1f | %.1f | %.0f | %s |\n", d, $2, $3, $1, a }'
done
echo
echo "wide MLP runs (samples/s, ms/step, comm ms/step):"
for d in float32 bfloat16; do
    echo "  $d: $(tr '\n' ';' <"$tmp/wide_$d")"
done
