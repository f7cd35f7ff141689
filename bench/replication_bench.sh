#!/usr/bin/env bash
# Replicated shards against unreplicated ones, in the same run, ROUNDS rounds (medians).
#
# PART all (the default):
#   1. ps-bench on 3 ps-servers, push and push-pull of one unsplit tensor: 16 MiB with replicas
#      1, 2 and 3; 4 KiB and 1 MiB with replicas 1 and 3 (one 1 s trial per cell and round);
#   2. the main job, ps-local's README shape with 1 epoch (--ps 2 --workers 3, asynchronous:
#      replicated clusters refuse BSP/SSP variables), with --replicas 1 and 2.
# PART acks (about 2 minutes with 3 rounds): ps-bench on 2 ps-servers, replicas 1 against 2,
#   push of one unsplit tensor of 4 KiB and 1 MiB with one client (one push in flight) and with
#   4 clients at once (push-mc); with PS_REPL_BENCH_BEFORE=PS_SERVER (an older build's
#   ps-server) its replicas 2 cells alternate beside, and the load average is printed;
#   PS_REPL_BENCH_ARGS adds ps-bench options to every configuration (e.g. --chunk-bytes=256K).
# The configurations alternate inside each round. Prints Markdown tables of the medians and the
# ratios against replicas 1.
#
#   bench/replication_bench.sh [BUILD_DIR [ROUNDS [PART]]]     (defaults: build 3 all)
#
# Needs etcd (/usr/bin/etcd or $PSD_ETCD) and Fashion-MNIST for the main job.
# PS_REPL_BENCH_KEEP=DIR keeps the raw outputs there.
set -eu
BUILD=${1:-build}
ROUNDS=${2:-3}
PART=${3:-all}
BEFORE=${PS_REPL_BENCH_BEFORE:-}
BENCH=$(realpath "$BUILD/bench/ps-bench")
LOCAL=$(realpath "$BUILD/deploy/local/ps-local")
ETCD=${PSD_ETCD:-/usr/bin/etcd}
[ -x "$ETCD" ] || { echo "replication_bench.sh: needs etcd ($ETCD)" >&2; exit 2; }

tmp=$(mktemp -d /tmp/ps-repl-bench-XXXXXX)
keep=${PS_REPL_BENCH_KEEP:-}
etcd_pid=
cleanup() {
    [ -z "$etcd_pid" ] || { kill "$etcd_pid" 2>/dev/null; wait "$etcd_pid" 2>/dev/null || true; }
    [ -z "$keep" ] || { mkdir -p "$keep" && cp "$tmp"/*.out "$tmp"/*.err "$keep"/ 2>/dev/null; }
    rm -rf "$tmp"
    return 0
}
trap cleanup EXIT
mapfile -t ports < <("$LOCAL" --print-ports 2)
curl="http://127.0.0.1:${ports[0]}" purl="http://127.0.0.1:${ports[1]}"
"$ETCD" --name rb --data-dir "$tmp/etcd" --listen-client-urls "$curl" \
    --advertise-client-urls "$curl" --listen-peer-urls "$purl" \
    --initial-advertise-peer-urls "$purl" --initial-cluster "rb=$purl" >"$tmp/etcd.err" 2>&1 &
etcd_pid=$!
sleep 2

if [ "$PART" = acks ]; then
    echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    confs="r1 r2"
    [ -z "$BEFORE" ] || confs="r1 r2b r2"
    # shellcheck disable=SC2054 # (commas inside option values)
    acks=(--servers=2 --sizes=4K,1M --ops=push,push-mc --clients=4 --no-raw --no-variants
        --seconds=1 --trials=1 --wait-idle=1 --split-threshold=64M)
    n=0
    for round in $(seq "$ROUNDS"); do
        for conf in $confs; do
            opts=()
            if [ "$conf" != r1 ]; then
                n=$((n + 1))
                opts=(--server-opt "replicas=2" --server-opt "coordinator=$curl"
                    --server-opt "coordinator-prefix=/replacks$n" --client-opt "replicas=2")
            fi
            [ "$conf" != r2b ] || opts+=("--server-bin=$(realpath "$BEFORE")")
            # shellcheck disable=SC2086 # (PS_REPL_BENCH_ARGS: options split at spaces)
            "$BENCH" "${acks[@]}" "${opts[@]}" ${PS_REPL_BENCH_ARGS:-} >"$tmp/acks-$round-$conf.out" \
                2>"$tmp/acks-$round-$conf.err"
        done
    done
    echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
    /usr/bin/python3 - "$tmp" "$ROUNDS" "$confs" <<'EOF'
import re, statistics, sys
tmp, rounds, confs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
cells = {}  # (cell, conf) -> list of (gbps, p50)
busy = []
for rd in range(1, rounds + 1):
    for c in confs:
        for line in open(f"{tmp}/acks-{rd}-{c}.out"):
            m = re.match(r"cell (push|push-mc)\s+servers=2 size=(\d+)\s+(?:clients=(\d+)\s+)?.*?"
                         r"([\d.]+) GB/s.*?p50\s+([\d.]+) us", line)
            if m:
                b = int(m[2])
                name = f"{m[1]} {b >> 20} MiB" if b >= 1 << 20 else f"{m[1]} {b >> 10} KiB"
                if m[3]:
                    name += f", {m[3]} clients"
                cells.setdefault((name, c), []).append((float(m[4]), float(m[5])))
            m = re.match(r"CPU during the run: machine (\d+)% busy.*other programs (\d+)%", line)
            if m:
                busy.append((int(m[1]), int(m[2])))
names = []
for (name, _c) in cells:
    if name not in names:
        names.append(name)
label = {"r1": "replicas 1", "r2b": "replicas 2 before", "r2": "replicas 2"}
print("| cell | " + " | ".join(label[c] for c in confs) + " | " +
      " | ".join(f"{label[c]} / 1" for c in confs[1:]) + " |")
print("|---" * (2 * len(confs)) + "|")
for name in names:
    for what, i, fmt in (("GB/s", 0, "{:.2f}"), ("p50", 1, "{:.0f} us")):
        if ("KiB" in name) != (what == "p50"):
            continue
        v = [statistics.median(x[i] for x in cells[(name, c)]) if cells.get((name, c)) else None
             for c in confs]
        row = [fmt.format(x) if x is not None else "-" for x in v]
        rat = [f"{x / v[0]:.2f}x" if x is not None and v[0] else "-" for x in v[1:]]
        print(f"| {name}, {what} | " + " | ".join(row + rat) + " |")
if busy:
    print(f"\nmachine busy during the runs: {min(b[0] for b in busy)}-{max(b[0] for b in busy)}%, "
          f"other programs {min(b[1] for b in busy)}-{max(b[1] for b in busy)}%")
EOF
    exit 0
fi

# shellcheck disable=SC2054 # (commas inside option values)
common=(--servers=3 --ops=push,push-pull --no-raw --no-variants --seconds=1 --trials=1
    --wait-idle=2 --split-threshold=64M)
n=0
for round in $(seq "$ROUNDS"); do
    for r in 1 2 3; do
        sizes=4K,1M,16M
        [ "$r" = 2 ] && sizes=16M
        opts=()
        if [ "$r" -gt 1 ]; then
            n=$((n + 1))
            opts=(--server-opt "replicas=$r" --server-opt "coordinator=$curl"
                --server-opt "coordinator-prefix=/replbench$n" --client-opt "replicas=$r")
        fi
        "$BENCH" "${common[@]}" "--sizes=$sizes" "${opts[@]}" >"$tmp/bench-$round-r$r.out" \
            2>"$tmp/bench-$round-r$r.err"
    done
    for r in 1 2; do
        opts=()
        [ "$r" -gt 1 ] && opts=(--replicas "$r" --etcd "$ETCD")
        TMPDIR=$tmp "$LOCAL" --ps 2 --workers 3 "${opts[@]}" -- --epochs 1 --staleness -1 \
            >"$tmp/job-$round-r$r.out" 2>"$tmp/job-$round-r$r.err"
    done
done

/usr/bin/python3 - "$tmp" "$ROUNDS" <<'EOF'
import re, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
cells = {}  # (op, size, r) -> list of (gbps, p50, cpu_server)
for rd in range(1, rounds + 1):
    for r in (1, 2, 3):
        for line in open(f"{tmp}/bench-{rd}-r{r}.out"):
            m = re.match(r"cell (\S+)\s+servers=3 size=(\d+)\s.*?([\d.]+) GB/s\s+p50\s+([\d.]+) us"
                         r".*CPU (\d+) \+ (\d+) us", line)
            if m:
                cells.setdefault((m[1], int(m[2]), r), []).append(
                    (float(m[3]), float(m[4]), float(m[6])))
def med(key, i):
    v = cells.get(key)
    return statistics.median(x[i] for x in v) if v else None
def size_name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
print("| cell | replicas 1 | replicas 2 | replicas 3 | 2/1 | 3/1 |")
print("|---|---|---|---|---|---|")
for size in (4096, 1 << 20, 16 << 20):
    for op in ("push", "push-pull"):
        for what, i, fmt in (("GB/s", 0, "{:.2f}"), ("p50", 1, "{:.0f} us"),
                             ("server CPU per op", 2, "{:.0f} us")):
            if size == 4096 and i != 1 or size != 4096 and i == 1:
                continue
            if what == "server CPU per op" and op != "push":
                continue
            v = [med((op, size, r), i) for r in (1, 2, 3)]
            if v[0] is None:
                continue
            row = [fmt.format(x) if x is not None else "-" for x in v]
            rat = [f"{x / v[0]:.2f}x" if x is not None and v[0] else "-" for x in v[1:]]
            print(f"| {op} {size_name(size)}, {what} | " + " | ".join(row + rat) + " |")
print()
print("| main job, 1 epoch | replicas 1 | replicas 2 | 2/1 |")
print("|---|---|---|---|")
job = {}
for rd in range(1, rounds + 1):
    for r in (1, 2):
        out = open(f"{tmp}/job-{rd}-r{r}.out").read()
        m = re.search(r"test_accuracy=([\d.]+) .*wall_s=([\d.]+) samples_per_s=([\d.]+)", out)
        s = re.search(r'"summary":true.*"samples_per_s":([\d.]+)',
                      open(f"{tmp}/job-{rd}-r{r}.err").read())
        if m and s:
            job.setdefault(r, []).append(tuple(float(x) for x in m.groups() + s.groups()))
for name, i, fmt in (("3 workers' samples/s (ps-local summary)", 3, "{:.0f}"),
                     ("worker 0 samples/s", 2, "{:.0f}"), ("worker 0 training wall s", 1, "{:.2f}"),
                     ("test accuracy", 0, "{:.4f}")):
    v = [statistics.median(x[i] for x in job[r]) if job.get(r) else None for r in (1, 2)]
    row = [fmt.format(x) if x is not None else "-" for x in v]
    rat = f"{v[1] / v[0]:.2f}x" if None not in v and v[0] else "-"
    print(f"| {name} | {row[0]} | {row[1]} | {rat} |")
print()
print("runs per configuration:", {r: len(v) for r, v in job.items()},
      "cells:", min(len(v) for v in cells.values()) if cells else 0)
EOF
grep -h "CPU during the run" "$tmp"/bench-*.out | sed 's/^/bench: /'
