# shellcheck shell=bash
# Shared by the ps-local benchmarks (bench/train_bench.sh, bench/checkpoint_train_bench.sh;
# source this file after setting $build).
#
#   bench_local NAME           sets $local_bin to the built ps-local, or exits 2 (NAME: the
#                              script's name in the message)
#   bench_run NAME WHAT OUT LOG CMD...
#                              runs CMD with stdout in OUT and stderr in LOG; if it fails,
#                              prints "NAME: WHAT failed:" and the last 20 lines of LOG, exit 1
#   bench_trained LOG          the workers' "trained ..." lines of LOG (JSON log format) as
#                              "aggregate_samples_per_s longest_wall_s mean_comm_ms_per_step
#                              mean_compute_ms_per_step" (aggregate: samples of all workers /
#                              the longest worker's training time)
#   median                     the median (the lower middle one) of the numbers on stdin
#   ratio A B                  B / A to two decimals, "-" when A is not positive
#   size_label BYTES           "4 KiB", "16 MiB" or "N B"

bench_local() {
    local_bin="$build/deploy/local/ps-local"
    if [ ! -x "$local_bin" ]; then
        echo "$1: $local_bin not built (meson compile -C $build)" >&2
        exit 2
    fi
}

bench_run() {
    local name=$1 what=$2 out=$3 log=$4
    shift 4
    if ! "$@" >"$out" 2>"$log"; then
        echo "$name: $what failed:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
}

bench_trained() {
    grep '"msg":"trained ' "$1" | awk '
        {
            match($0, /"samples":[0-9]+/); s = substr($0, RSTART + 10, RLENGTH - 10)
            match($0, /"wall_s":[0-9.]+/); w = substr($0, RSTART + 9, RLENGTH - 9)
            match($0, /"comm_ms_per_step":[0-9.]+/); c = substr($0, RSTART + 19, RLENGTH - 19)
            match($0, /"compute_ms_per_step":[0-9.]+/); k = substr($0, RSTART + 22, RLENGTH - 22)
            samples += s; if (w > wall) wall = w; comm += c; comp += k; n++
        }
        END { printf "%.1f %.1f %.3f %.3f\n", samples / wall, wall, comm / n, comp / n }'
}

median() {
    sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'
}

ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "-" }'
}

size_label() {
    awk -v b="$1" 'BEGIN { if (b >= 1048576 && b % 1048576 == 0) printf "%d MiB", b / 1048576;
        else if (b >= 1024 && b % 1024 == 0) printf "%d KiB", b / 1024; else printf "%d B", b }'
}
