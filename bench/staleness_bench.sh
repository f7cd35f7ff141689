#!/usr/bin/env bash
# Time to a fixed test accuracy under each staleness bound, with one worker slowed down
# (README: "Consistency"). 1 ps and 2 workers on loopback, Fashion-MNIST, worker 1 sleeps
# --delay ms after each step. Prints a markdown table.
#   bench/staleness_bench.sh [--build-dir build] [--delay 15] [--epochs 3] [--target 0.85]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build delay=15 epochs=3 target=0.85 bounds="0 2 8 -1"
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --bounds) bounds=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$build/deploy/local/ps-local" ] || { echo "build first: meson compile -C $build" >&2; exit 2; }
echo "| staleness s | time to test accuracy $target (s) | final test accuracy | wall (s) | max staleness seen |"
echo "|---|---|---|---|---|"
for s in $bounds; do
  start=$(date +%s.%N)
  line=$("$build/deploy/local/ps-local" --ps 1 --workers 2 -- --epochs "$epochs" --staleness "$s" \
    --slow-worker 1 --slow-delay-ms "$delay" --eval-every 50 --target-accuracy "$target" \
    --log-level warn 2>/dev/null | grep '^test_accuracy=')
  wall=$(echo "$(date +%s.%N) - $start" | bc)
  get() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$line"; }
  ttt=$(get time_to_target_s)
  [ "$ttt" = "-1.00" ] && ttt="not reached"
  printf '| %s | %s | %s | %.1f | %s |\n' "$s" "$ttt" "$(get test_accuracy)" "$wall" "$(get staleness_max)"
done
