#!/bin/sh
# Builds ps-bench and ps-server with -Dbuildtype=release into build-release and runs the full
# wire benchmark (bench/RESULTS.md, "Wire throughput"); progress lines and the tables go to
# stdout, build output to stderr.
#
#   bench/run.sh [--no-glibc] [ps-bench options...]
#
# Unless --no-glibc is given it also builds build-release-glibc (-Djemalloc=disabled) so that
# the allocator table has a glibc malloc row beside the project's jemalloc settings and
# jemalloc's defaults.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

glibc=1
if [ "${1:-}" = "--no-glibc" ]; then
    glibc=0
    shift
fi

build() { # dir, meson options...
    dir=$1
    shift
    if [ -f "$dir/build.ninja" ]; then
        meson configure "$dir" -Dbuildtype=release "$@" >&2
    else
        meson setup "$dir" -Dbuildtype=release "$@" >&2
    fi
    # Only what the benchmark runs: the rest of the tree is not needed here.
    ninja -C "$dir" bench/ps-bench server/ps-server >&2
}

build build-release
if [ "$glibc" = 1 ]; then
    build build-release-glibc -Djemalloc=disabled
    set -- --glibc-build "$root/build-release-glibc" "$@"
fi
echo "\$ build-release/bench/ps-bench --server-bin build-release/server/ps-server $*"
exec "$root/build-release/bench/ps-bench" --server-bin "$root/build-release/server/ps-server" "$@"
