#!/usr/bin/env bash
# Overlap of communication with computation in ps-worker (bench/RESULTS.md, "Overlap"): the main
# job's shape (784-256-128-10, batch 128, Adam, 1 ps) with 1 and 2 workers, --overlap off, inside the step (w*_instep) and with --prefetch (w*_on, w2_after) and
# over tcp (ps-local's default) and ipc://, beside the model's math alone on one core
# (ps-step-bench) and the server's optimizer loop alone (ps-optimizer-bench); and the wide MLP
# (784-4096-4096-10) with and without overlap. Runs alternate; every cell is the median of R.
#
#   bench/overlap_bench.sh [--build-dir DIR] [--steps N] [--wide-steps N] [--repeat R]
#
# Per run: aggregate samples/s (all workers' samples / the longest worker's training time);
# per worker step (mean over workers): compute, exposed communication (blocked on the cluster
# or starting requests, waiting excluded), waiting (blocked for prefetched parameters), the
# worker's CPU (every thread); the ps-server's CPU per worker step and per gradient byte applied
# (utime + stime of /proc/PID/stat over the run, sampled every 50 ms).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
steps=2000
wide_steps=20
repeat=3
while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) build=$(realpath -m "$2"); shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --wide-steps) wide_steps=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "overlap_bench.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

# shellcheck source=lib.sh
. "$root/bench/lib.sh"
bench_local overlap_bench
tmp=$(mktemp -d /tmp/ps-overlap-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
tick=$(getconf CLK_TCK)

# CPU seconds (utime + stime) of pid $1 until it exits, sampled into file $2.
watch_cpu() {
    local pid=$1 out=$2 stat
    while stat=$(cat "/proc/$pid/stat" 2>/dev/null); do
        echo "$stat" | sed 's/^.*) //' | awk -v t="$tick" '{ printf "%.3f\n", ($12 + $13) / t }' >"$out"
        sleep 0.05
    done
}

# run NAME WORKERS LAYERS STEPS ELEMENTS [ps-local flags] -- [ps-worker flags]: one training
# run; appends "sps compute_ms comm_ms wait_ms worker_cpu_ms server_cpu_ms server_ns_per_byte"
# to $tmp/NAME.
run() {
    local name=$1 workers=$2 layers=$3 nsteps=$4 elements=$5
    shift 5
    local lflags=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do lflags+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    local log="$tmp/run.log"
    "$local_bin" --ps 1 --workers "$workers" "${lflags[@]}" -- --layers "$layers" \
        --steps "$nsteps" --optimizer adam --batch-size 128 --log-format json \
        --log-every 1000000 --eval-every 1000000000 --model-name "ob_$name" "$@" \
        >"$tmp/run.out" 2>"$log" &
    local l=$! spid=""
    for _ in $(seq 200); do
        spid=$(sed -n 's/.*started ps 0 (pid \([0-9]*\)).*/\1/p' "$log" | head -n 1)
        [ -n "$spid" ] && break
        sleep 0.05
    done
    : >"$tmp/cpu"
    [ -n "$spid" ] && watch_cpu "$spid" "$tmp/cpu" &
    local watcher=$!
    if ! wait "$l"; then
        echo "overlap_bench: run $name failed:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
    wait "$watcher" 2>/dev/null || true
    local scpu
    scpu=$(cat "$tmp/cpu" 2>/dev/null || echo 0)
    grep '"msg":"trained ' "$log" | awk -v scpu="${scpu:-0}" -v el="$elements" '
        function f(k,   r) { if (match($0, "\"" k "\":[0-9.]+")) { r = substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3); return r + 0 } return 0 }
        { s += f("samples"); w = f("wall_s"); if (w > wall) wall = w; st += f("steps")
          comp += f("compute_ms_per_step"); comm += f("comm_ms_per_step"); wt += f("wait_ms_per_step")
          cpu += f("cpu_ms_per_step"); n++ }
        END { printf "%.1f %.3f %.3f %.3f %.3f %.3f %.3f\n", s / wall, comp / n, (comm - wt) / n,
              wt / n, cpu / n, scpu * 1e3 / st, scpu * 1e9 / (st * el * 4) }' >>"$tmp/$name"
}

main=784,256,128,10
wide=784,4096,4096,10
main_el=235146
wide_el=20037642
configs="w1_off w1_on w1_instep w2_before w2_tcp_off w2_ipc_on w2_after w2_instep wide_off wide_on wide_bsp_off wide_bsp_on"
for c in $configs; do : >"$tmp/$c"; done
: >"$tmp/math"
: >"$tmp/opt"
for _ in $(seq "$repeat"); do
    "$build/worker/ps-step-bench" --device cpu --layers "$main" --batch 128 --seconds 2 2>/dev/null |
        awk '$1 == "step" { print $3 }' >>"$tmp/math"
    "$build/bench/ps-optimizer-bench" --elements "$main_el" --seconds 1 |
        sed -n 's/.*us_per_apply=\([0-9.]*\).*/\1/p' >>"$tmp/opt"
    run w1_off 1 "$main" "$steps" "$main_el" -- --overlap=false
    run w1_on 1 "$main" "$steps" "$main_el" -- --prefetch=true
    run w1_instep 1 "$main" "$steps" "$main_el" --
    run w2_before 2 "$main" "$steps" "$main_el" --transport ipc -- --overlap=false
    run w2_tcp_off 2 "$main" "$steps" "$main_el" -- --overlap=false
    run w2_ipc_on 2 "$main" "$steps" "$main_el" --transport ipc -- --prefetch=true
    run w2_after 2 "$main" "$steps" "$main_el" -- --prefetch=true
    run w2_instep 2 "$main" "$steps" "$main_el" --
    run wide_off 1 "$wide" "$wide_steps" "$wide_el" -- --overlap=false
    run wide_on 1 "$wide" "$wide_steps" "$wide_el" -- --prefetch=true
    run wide_bsp_off 1 "$wide" "$wide_steps" "$wide_el" -- --overlap=false --staleness 0
    run wide_bsp_on 1 "$wide" "$wide_steps" "$wide_el" -- --staleness 0
done
math=$(median <"$tmp/math")
opt=$(median <"$tmp/opt")
echo "load before the last run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "math alone (ps-step-bench --device cpu, one core): $math samples/s; runs: $(tr '\n' ' ' <"$tmp/math")"
echo "Adam over $main_el elements alone (ps-optimizer-bench): $opt us per apply; runs: $(tr '\n' ' ' <"$tmp/opt")"
echo
echo "| run | samples/s | / math | compute ms | exposed comm ms | waiting ms | step ms | worker CPU ms | server CPU ms | server ns/byte | runs (samples/s) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for c in $configs; do
    sort -n "$tmp/$c" | awk -v m="$math" -v c="$c" -v all="$(awk '{ printf "%s ", $1 }' "$tmp/$c")" '
        { a[NR] = $0 } END { split(a[int((NR + 1) / 2)], x, " ")
          printf "| %s | %.0f | %.2f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s|\n", c, x[1],
              x[1] / m, x[2], x[3], x[4], x[2] + x[3] + x[4], x[5], x[6], x[7], all }'
done
