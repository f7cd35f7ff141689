#!/usr/bin/env bash
# The main job: builds the project and trains Fashion-MNIST on a local cluster on loopback
# (1 ps-server and 2 ps-worker processes by default), ending with worker 0's line
# "test_accuracy=...". Packages come from deploy/setup.sh.
#
#   deploy/run-main.sh [--ps N] [--workers N] [--chief] [--build-dir DIR] [--] [ps-worker flags]
#
# Flags after the counts (or after --) go to every ps-worker, e.g. --epochs 5 --batch-size 128;
# `build/worker/ps-worker --help` lists them. The launcher (ps-local) stops every process on
# Ctrl-C or when one fails, and its exit code (this script's) says whether training succeeded:
# 0 success, 2 bad configuration or data, 130 interrupted, else the failing process's code.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
launcher_args=()

usage() {
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
    --ps | --workers)
        [ $# -ge 2 ] || { echo "run-main: $1 needs a number" >&2; exit 2; }
        case "$2" in
        '' | *[!0-9]*) echo "run-main: $1 needs a number, got '$2'" >&2; exit 2 ;;
        esac
        launcher_args+=("$1" "$2")
        shift 2
        ;;
    --chief)
        launcher_args+=(--chief)
        shift
        ;;
    --build-dir)
        [ $# -ge 2 ] || { echo "run-main: --build-dir needs a directory" >&2; exit 2; }
        build=$(realpath -m "$2")
        shift 2
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    --)
        shift
        break
        ;;
    *)
        break
        ;;
    esac
done

# nvcc lives outside PATH on these machines; with it the build includes the CUDA backend, which
# ps-worker's --device auto uses when a GPU answers.
if [ -d /usr/local/cuda/bin ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
fi

for tool in meson ninja; do
    if ! command -v "$tool" >/dev/null; then
        echo "run-main: $tool not found: run 'deploy/setup.sh' first" >&2
        exit 2
    fi
done

# Its own lines: text on a terminal, else JSON lines like every other line on stderr.
note() {
    if [ -t 2 ]; then
        echo "run-main: $1" >&2
    else
        local m=${1//\\/\\\\}
        m=${m//\"/\\\"}
        printf '{"ts":"%s","level":"%s","role":"run-main","task":-1,"msg":"%s"}\n' \
            "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)" "${2:-info}" "$m" >&2
    fi
}

# Quiet unless something fails.
quiet() {
    local out
    if ! out=$("$@" 2>&1); then
        printf '%s\n' "$out" >&2
        note "failed: $*" error
        exit 1
    fi
}
if [ ! -f "$build/build.ninja" ]; then
    note "configuring $build"
    quiet meson setup "$build" "$root"
fi
note "building ps-server, ps-worker, ps-local"
quiet meson compile -C "$build" ps-server ps-worker ps-local

exec "$build/deploy/local/ps-local" "${launcher_args[@]}" -- "$@"
