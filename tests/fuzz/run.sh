#!/bin/sh
# Builds the libFuzzer harnesses (fuzz_frame: frame decoder; fuzz_dispatch: the server's method
# dispatch on a real store) with clang (ASan + UBSan, own build dir) and runs each for
# SECONDS (default 60) on its seed corpus in tests/fuzz/corpus/<harness>/ (new inputs go to a
# scratch copy). Exits non-zero on a crash (the reproducer is left in the build dir).
#   tests/fuzz/run.sh [SECONDS] [BUILD_DIR]
set -eu
secs=${1:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${2:-$root/build-fuzz}
case "$build" in /*) ;; *) build="$(pwd)/$build" ;; esac
command -v clang >/dev/null || { echo "fuzz: clang not found" >&2; exit 2; }
if [ ! -d "$build" ]; then
  CC=clang meson setup "$build" "$root" -Dfuzz=true -Dcuda=disabled -Djemalloc=disabled \
    -Dexamples=false -Db_sanitize=address,undefined -Db_lundef=false \
    -Dc_args=-fsanitize=fuzzer-no-link >/dev/null
fi
harnesses="fuzz_frame fuzz_dispatch"
# Regenerate first when meson.build files changed (meson compile resolves targets before that).
ninja -C "$build" build.ninja >/dev/null
meson compile -C "$build" tests/fuzz_frame tests/fuzz_dispatch >/dev/null
status=0
for h in $harnesses; do
  work="$build/fuzz-corpus-$h"
  mkdir -p "$work"
  cp "$root/tests/fuzz/corpus/$h/"* "$work/" 2>/dev/null || true
  echo "fuzz: $h for ${secs}s"
  log="$build/fuzz-$h.log"
  rc=0
  (cd "$build" && "./tests/$h" -max_total_time="$secs" -print_final_stats=1 "$work" \
    "$root/tests/fuzz/corpus/$h" >"$log" 2>&1) || rc=$?
  grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units|cov:|ERROR|SUMMARY" "$log" | tail -4
  if [ "$rc" -ne 0 ]; then
    # A crash, a leak, a timeout or a harness that did not start: the reproducer (if any) is
    # in the build dir as crash-*, leak-*, timeout-* or oom-*; the whole output in $log.
    echo "fuzz: $h failed (libFuzzer exit $rc); see $log" >&2
    status=1
  fi
done
exit "$status"
