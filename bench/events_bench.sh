#!/usr/bin/env bash
# The cost of TensorBoard event files: the main job's configuration (deploy/run-main.sh's
# defaults: 1 ps, 2 asynchronous workers, 784-256-128-10, batch 128, Adam) for --steps steps,
# run alternately without and with ps-local --logdir (workers at the default --events-every,
# the server at its default events-interval-s), --pairs times. Reports each run's mean
# ms/step of the two workers (each worker's "trained ..." line: training time over steps) and
# the median of each side, and the difference in percent. Prints a markdown table for
# bench/RESULTS.md.
#
#   bench/events_bench.sh [--build-dir DIR] [--steps N] [--pairs P] [--] [extra ps-worker flags]
#
#   --steps N   steps per worker per run (default 600)
#   --pairs P   runs without and with --logdir, alternated (default 3)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
steps=600
pairs=3
while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) build=$(realpath -m "$2"); shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) break ;;
    esac
done
extra=("$@")
local_bin="$build/deploy/local/ps-local"
[ -x "$local_bin" ] || { echo "events_bench: no $local_bin (build first)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/ps-events-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# One run: prints the mean ms/step of the workers.
run_once() {
    local name=$1
    shift
    "$local_bin" --ps 1 --workers 2 --timeout 300 "$@" -- --steps "$steps" --log-format json \
        --model-name "eb_$name" "${extra[@]}" >"$tmp/$name.out" 2>"$tmp/$name.log" ||
        { echo "events_bench: run $name failed" >&2; tail -5 "$tmp/$name.log" >&2; exit 1; }
    python3 - "$tmp/$name.log" <<'PY'
import json, sys
ms = []
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    if d.get("role") in ("worker", "chief") and "wall_s" in d and "steps" in d and d["steps"]:
        ms.append(d["wall_s"] * 1e3 / d["steps"])
print(f"{sum(ms) / len(ms):.3f}")
PY
}

off=()
on=()
echo "| pair | without --logdir (ms/step) | with --logdir (ms/step) |"
echo "|---|---|---|"
for i in $(seq 1 "$pairs"); do
    a=$(run_once "off$i")
    rm -rf "$tmp/logs"
    b=$(run_once "on$i" --logdir "$tmp/logs")
    off+=("$a")
    on+=("$b")
    echo "| $i | $a | $b |"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
mo=$(median "${off[@]}")
mn=$(median "${on[@]}")
echo "| median | $mo | $mn |"
awk -v a="$mo" -v b="$mn" 'BEGIN { printf "\nwith --logdir: %+.2f%% step time (%d steps per worker, %d pairs)\n", (b - a) / a * 100, '"$steps"', '"$pairs"' }'
echo "event files of the last run: $(find "$tmp/logs" -type f | wc -l) files, $(du -sk "$tmp/logs" | cut -f1) KiB"
