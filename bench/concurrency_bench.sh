#!/usr/bin/env bash
# Concurrent pushes against two ps-server binaries (bench/RESULTS.md, "Wire throughput"):
# ps-bench's push-mc, N client threads each with its own ps_client and variable pushing to one
# server at once, with 8 clients and 1 (the reference) at 4 KiB and 1 MiB. The two servers run
# alternately, RUNS times each (baseline, new, baseline, new, ...), so that a slow spell of a
# shared machine hits both; prints the medians and new/baseline as a markdown table.
#
#   bench/concurrency_bench.sh [--bench PS-BENCH] [--runs 3] [--seconds 2] [--clients 1,8]
#       [--sizes 4K,1M] [--transport tcp] [BASELINE-SERVER [NEW-SERVER]] [-- PS-BENCH-OPTIONS]
#
# Defaults: build-release/bench/ps-bench; build-release/server/ps-server for both servers (the
# protocol is stable, so one ps-bench drives an older server: build the baseline from a
# worktree, e.g. git worktree add /tmp/base REV && meson setup /tmp/base/build-release
# -Dbuildtype=release && ninja -C /tmp/base/build-release server/ps-server).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
. "$root/bench/lib.sh"
bench=$root/build-release/bench/ps-bench
runs=3 seconds=2 clients=1,8 sizes=4K,1M transport=tcp
servers=()
while [ $# -gt 0 ]; do
    case $1 in
    --bench) bench=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "concurrency_bench.sh: unknown option $1" >&2; exit 2 ;;
    *) servers+=("$1"); shift ;;
    esac
done
base=${servers[0]:-$root/build-release/server/ps-server}
new=${servers[1]:-$root/build-release/server/ps-server}
for f in "$bench" "$base" "$new"; do
    [ -x "$f" ] || { echo "concurrency_bench.sh: $f not built" >&2; exit 2; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/concurrency_bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

args=(--servers 1 --no-raw --no-variants --transport "$transport" --ops push-mc
    --clients "$clients" --sizes "$sizes" --seconds "$seconds" --warmup 0.3 --trials 1
    --wait-idle 2 --timeout 300)
echo "baseline: $base ($("$base" --version 2>&1 | head -n 1))"
echo "new:      $new ($("$new" --version 2>&1 | head -n 1))"
echo "\$ $bench --server-bin SERVER ${args[*]} $*   ($runs runs of each server, alternately)"
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"

# results: "label size clients gbps pushes_s p50_us" lines
for run in $(seq 1 "$runs"); do
    for label in baseline new; do
        if [ $label = baseline ]; then srv=$base; else srv=$new; fi
        out=$tmp/$label-$run.out
        if ! "$bench" --server-bin "$srv" "${args[@]}" "$@" >"$out" 2>"$tmp/err"; then
            echo "concurrency_bench.sh: run $run of $label failed:" >&2
            tail -n 20 "$out" "$tmp/err" >&2
            exit 1
        fi
        # cell push-mc servers=1 size=4096 clients=8 ops=N S s G GB/s P pushes/s
        #   per-client p50 X us ...
        awk -v label=$label '$1 == "cell" && $2 ~ /^push-mc/ && $5 ~ /^clients=/ {
            size = $4; sub(/size=/, "", size); n = $5; sub(/clients=/, "", n)
            for (i = 6; i <= NF; i++) {
                if ($i == "GB/s") g = $(i - 1)
                if ($i == "pushes/s") p = $(i - 1)
                if ($i == "p50" && $(i - 1) == "per-client") l = $(i + 1)
            }
            print label, size, n, g, p, l
        }' "$out" | tee -a "$tmp/results" | sed "s/^/  run $run: /" >&2
    done
done

col() { awk -v l="$1" -v s="$2" -v n="$3" -v c="$4" '$1 == l && $2 == s && $3 == n { print $c }' \
    "$tmp/results"; }

echo
echo "| size | clients | baseline GB/s | new GB/s | new/baseline | baseline pushes/s | new pushes/s |" \
    "baseline per-client p50 µs | new per-client p50 µs | new/baseline p50 | runs, GB/s (baseline; new) |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
awk '{ print $2, $3 }' "$tmp/results" | sort -n -k1,1 -k2,2 -u | while read -r size n; do
    bg=$(col baseline "$size" "$n" 4 | median) ng=$(col new "$size" "$n" 4 | median)
    bp=$(col baseline "$size" "$n" 5 | median) np=$(col new "$size" "$n" 5 | median)
    bl=$(col baseline "$size" "$n" 6 | median) nl=$(col new "$size" "$n" 6 | median)
    rb=$(col baseline "$size" "$n" 4 | paste -sd' ') rn=$(col new "$size" "$n" 4 | paste -sd' ')
    printf "| %s | %s | %.3f | %.3f | %s | %.0f | %.0f | %.0f | %.0f | %s | %s; %s |\n" \
        "$(size_label "$size")" "$n" "$bg" "$ng" "$(ratio "$bg" "$ng")" "$bp" "$np" "$bl" "$nl" \
        "$(ratio "$bl" "$nl")" "$rb" "$rn"
done
echo
echo "(medians of $runs runs of ${seconds} s per server; one server, $transport; new/baseline above 1" \
    "in GB/s and below 1 in p50: the new server is faster)"
