#!/usr/bin/env bash
# tcp against ipc:// (bench/RESULTS.md, "Wire throughput"): RUNS runs of ps-bench --transport
# both with one server (every cell over loopback TCP, then over a Unix socket, size by size),
# and the medians of the runs as a markdown table with the ipc/tcp ratios.
#
#   bench/transport_bench.sh [--bench PS-BENCH] [--server PS-SERVER] [--runs 3] [--seconds 1]
#       [--sizes 4K,1M,16M] [--ops push,pull] [-- PS-BENCH-OPTIONS]
#
# Defaults: build-release/bench/ps-bench and build-release/server/ps-server (bench/run.sh builds
# both).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
. "$root/bench/lib.sh"
bench=$root/build-release/bench/ps-bench server=$root/build-release/server/ps-server
runs=3 seconds=1 sizes=4K,1M,16M ops=push,pull
while [ $# -gt 0 ]; do
    case $1 in
    --bench) bench=$2; shift 2 ;;
    --server) server=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "transport_bench.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
for f in "$bench" "$server"; do
    [ -x "$f" ] || { echo "transport_bench.sh: $f not built (bench/run.sh builds it)" >&2; exit 2; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/transport_bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

args=(--server-bin "$server" --transport both --servers 1 --sizes "$sizes" --ops "$ops"
    --no-variants --seconds "$seconds" --warmup 0.2 --trials 1 --wait-idle 2)
echo "\$ $bench ${args[*]} $*   ($runs runs)"
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for run in $(seq 1 "$runs"); do
    if ! "$bench" "${args[@]}" "$@" >"$tmp/out" 2>"$tmp/err"; then
        echo "transport_bench.sh: run $run failed:" >&2
        tail -n 20 "$tmp/out" "$tmp/err" >&2
        exit 1
    fi
    grep '^CPU during the run' "$tmp/out" | sed "s/^/  run $run: /" >&2
    # cell push/ipc servers=1 size=4096 ops=N S s G GB/s p50 X us ... -> "push ipc 4096 G X"
    awk '$1 == "cell" && $2 ~ /\/(tcp|ipc)$/ && $5 !~ /^clients=/ {
        split($2, lt, "/"); size = $4; sub(/size=/, "", size)
        for (i = 6; i <= NF; i++) {
            if ($i == "GB/s") g = $(i - 1)
            if ($i == "p50") p = $(i + 1)
        }
        print lt[1], lt[2], size, g, p
    }' "$tmp/out" >>"$tmp/results"
done

col() { awk -v o="$1" -v t="$2" -v s="$3" -v c="$4" '$1 == o && $2 == t && $3 == s { print $c }' \
    "$tmp/results"; }
echo
echo "| size | op | tcp GB/s | ipc GB/s | ipc/tcp GB/s | tcp p50 µs | ipc p50 µs | ipc/tcp p50 |" \
    "runs, GB/s (tcp; ipc) |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---|"
awk '{ print $3 }' "$tmp/results" | sort -n -u | while read -r size; do
    for op in raw push pull push-pull; do
        [ -n "$(col $op tcp "$size" 4)" ] || continue
        tg=$(col $op tcp "$size" 4 | median) ig=$(col $op ipc "$size" 4 | median)
        tp=$(col $op tcp "$size" 5 | median) ip=$(col $op ipc "$size" 5 | median)
        printf "| %s | %s | %.2f | %.2f | %s | %.0f | %.0f | %s | %s; %s |\n" \
            "$(size_label "$size")" $op "$tg" "$ig" "$(ratio "$tg" "$ig")" "$tp" "$ip" \
            "$(ratio "$tp" "$ip")" "$(col $op tcp "$size" 4 | paste -sd' ')" \
            "$(col $op ipc "$size" 4 | paste -sd' ')"
    done
done
echo
echo "(medians of $runs runs, each cell one trial of $seconds s; 1 server; ipc/tcp above 1 in GB/s" \
    "and below 1 in p50: ipc is faster)"
