#!/usr/bin/env bash
# Accuracy of --model embbag-mlp on apt's package index with the table's rows stored in
# float32, bfloat16 and float16 (--embed-dtype), alternated round by round.
#
#   bench/embed_dtype_bench.sh [BUILD_DIR] [ROUNDS] [-- EXTRA WORKER FLAGS]
#       Converts apt's Packages lists with tools/apt_features.py (every package; 2^20 buckets),
#       then per round runs ps-local (2 ps-server processes, 1 worker) once per dtype, in a
#       rotated order, with the flags of the worker-embbag-apt test (--layers 32,64,CLASSES
#       --batch-size 64 --epochs 3 --lr 0.003, Adam) unless EXTRA flags are given (they are
#       added after them). Prints each run's test accuracy, then the median per dtype and its
#       difference from float32 in points, and the machine's load average before and after.
set -u
build=${1:-build}
rounds=${2:-3}
shift $(($# > 2 ? 2 : $#))
[ "${1:-}" = "--" ] && shift
extra=("$@")
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
bench_local embed_dtype_bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 "$here/../tools/apt_features.py" --out-dir "$tmp" --buckets 1048576 \
    >"$tmp/convert.out" 2>&1 || {
    echo "embed_dtype_bench: apt_features.py failed: $(cat "$tmp/convert.out")" >&2
    exit 1
}
cat "$tmp/convert.out"
classes=$(wc -l <"$tmp/sections.txt")
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
dtypes=(float32 bfloat16 float16)
for ((r = 0; r < rounds; r++)); do
    for ((k = 0; k < 3; k++)); do
        d=${dtypes[$(((k + r) % 3))]}
        bench_run embed_dtype_bench "$d round $r" "$tmp/run.out" "$tmp/run.err" \
            "$local_bin" --ps 2 --workers 1 --timeout 300 -- --model embbag-mlp \
            --train-sparse "$tmp/train.txt" --test-sparse "$tmp/test.txt" \
            --layers "32,64,$classes" --batch-size 64 --epochs 3 --lr 0.003 --log-every 1000 \
            --embed-dtype "$d" "${extra[@]}"
        acc=$(sed -n 's/^test_accuracy=\([0-9.]*\).*/\1/p' "$tmp/run.out")
        echo "round $r $d test_accuracy=$acc"
        echo "$acc" >>"$tmp/acc.$d"
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
base=$(median <"$tmp/acc.float32")
for d in "${dtypes[@]}"; do
    m=$(median <"$tmp/acc.$d")
    echo "$d median test_accuracy $m ($(awk -v a="$m" -v b="$base" 'BEGIN { printf "%+.2f", (a - b) * 100 }') points against float32)"
done
