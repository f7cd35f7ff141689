#!/usr/bin/env bash
# Replicated sparse tables against unreplicated ones, in the same run: ps-table-bench --wire on 2
# ps-servers with --replicas 1 and 2 alternated for ROUNDS rounds (medians of push and pull
# ids/s, Zipf(1.1) ids over 10^6 rows, dim 16, Adagrad, 8,192 ids per call, 4 in flight), and
# the ratios replicas 2 / replicas 1. The load average is printed beside them.
#
#   bench/table_replication_bench.sh [BUILD_DIR [ROUNDS]]     (defaults: build 5)
#
# Needs etcd (/usr/bin/etcd or $PSD_ETCD).
set -eu
BUILD=${1:-build}
ROUNDS=${2:-5}
TB=$(realpath "$BUILD/bench/ps-table-bench")
PS=$(realpath "${PSD_BENCH_PS_SERVER:-$BUILD/server/ps-server}")
ETCD=${PSD_ETCD:-/usr/bin/etcd}
[ -x "$ETCD" ] || { echo "table_replication_bench.sh: needs etcd ($ETCD)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/ps-table-repl-bench-XXXXXX)
etcd_pid=
cleanup() {
    [ -z "$etcd_pid" ] || { kill "$etcd_pid" 2>/dev/null; wait "$etcd_pid" 2>/dev/null || true; }
    rm -rf "$tmp"
}
trap cleanup EXIT
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cp=$(port) pp=$(port)
curl="http://127.0.0.1:$cp"
"$ETCD" --name tb --data-dir "$tmp/etcd" --listen-client-urls "$curl" --advertise-client-urls "$curl" \
    --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
    --initial-cluster "tb=http://127.0.0.1:$pp" >"$tmp/etcd.err" 2>&1 &
etcd_pid=$!
sleep 2
common=(--rows 1000000 --dims 16 --batch 8192 --batches 60 --wire "$PS" --servers 2 --inflight 4)
for round in $(seq "$ROUNDS"); do
    for r in 1 2; do
        "$TB" "${common[@]}" --replicas "$r" --coordinator "$curl" >"$tmp/r$r-$round.out" \
            2>"$tmp/r$r-$round.err"
    done
done
echo "# $(date -u +%FT%TZ) table_replication_bench.sh: $ROUNDS rounds; load $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$tmp" "$ROUNDS" <<'PY'
import statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
vals = {}
for r in (1, 2):
    for rd in range(1, rounds + 1):
        for line in open(f"{tmp}/r{r}-{rd}.out"):
            f = [x.strip() for x in line.strip().strip("|").split("|")]
            if len(f) == 10 and f[0] == "16" and f[2] == str(r):
                vals.setdefault(r, []).append((float(f[5]), float(f[6])))
med = {r: (statistics.median(v[0] for v in vals[r]), statistics.median(v[1] for v in vals[r]))
       for r in vals}
print("| 2 servers, dim 16 | replicas 1 | replicas 2 | 2/1 |")
print("|---|---:|---:|---:|")
for i, name in ((0, "push ids/s"), (1, "pull ids/s")):
    print(f"| {name} | {med[1][i]:.0f} | {med[2][i]:.0f} | {med[2][i] / med[1][i]:.2f} |")
PY
