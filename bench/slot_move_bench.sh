#!/usr/bin/env bash
# Moving slots under load (bench/RESULTS.md, "Moving slots"): two servers holding N rows of
# dim 16 (Adagrad) and 2 clients pushing batches of 64 random rows; a third server joins and
# psctl add-server moves it a third of the slots; then psctl remove-server moves them back.
# Reports, per move: the bytes moved against a third of the table's bytes (rows x (16
# parameters + 16 Adagrad slots) x 4 + id and update time), the longest push during the move
# against the p99 before it, the copy rate (bytes / the move's wall time) against ps-bench's
# 1 MiB push rate, and whether every acknowledged push is there (exact count).
#
# Also, per move: the bytes sent before the batches froze (snapshots) and under the freeze, and
# the time each batch was frozen (psctl --json's "frozen": the source's freeze of the SEND, the
# flip and the COMMITs), where psctl and the servers report them.
#
#   bench/slot_move_bench.sh BUILD_DIR [ROWS]      (ROWS default 1000000; needs etcd)
#   SLOT_BENCH_BATCH=N: psctl --batch-slots N (default 64)
set -u
build=${1:?build dir}; rows=${2:-1000000}
bin=$build/server/ps-server psctl=$build/client/psctl drv=$build/bench/ps-slot-move-bench
etcd=${PSD_ETCD:-/usr/bin/etcd}
[ -x "$etcd" ] || { echo "no etcd at $etcd"; exit 77; }
tmp=$(mktemp -d /tmp/psd-slot-bench-XXXXXX)
pids=()
cleanup() { for p in $(jobs -rp); do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_log() { for _ in $(seq $(( $3 * 10 ))); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
cp=$(port); pp=$(port)
"$etcd" --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$cp" \
  --advertise-client-urls "http://127.0.0.1:$cp" --listen-peer-urls "http://127.0.0.1:$pp" \
  --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
  --initial-cluster "default=http://127.0.0.1:$pp" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
coord="http://127.0.0.1:$cp"
sleep 1
a=(); for i in 0 1 2; do a+=("127.0.0.1:$(port)"); done
spec="{\"ps\":[\"${a[0]}\",\"${a[1]}\"]}"
for i in 0 1; do
  "$bin" --cluster "$spec" --task ps:$i --coordinator "$coord" 2>"$tmp/ps$i.log" &
  pids+=($!)
done
for i in 0 1; do wait_log "$tmp/ps$i.log" "serving on" 15 || { echo "ps$i did not start"; exit 1; }; done
export TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" PS_RETRIES=100 PS_DEADLINE_MS=60000
t0=$(date +%s.%N)
"$drv" load "$rows" || exit 1
echo "load: $(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')") s"
"$bin" --cluster "$spec" --join --listen "tcp://${a[2]}" --coordinator "$coord" 2>"$tmp/ps2.log" &
pids+=($!)
wait_log "$tmp/ps2.log" "serving on" 15 || { echo "the joining server did not start"; exit 1; }

"$drv" push "$rows" "$tmp/stop" "$tmp/push" >"$tmp/push.log" 2>&1 &
pusher=$!; pids+=($pusher)
sleep 5
ctl=("$psctl" --cluster "$spec" --coordinator "$coord" --json --batch-slots "${SLOT_BENCH_BATCH:-64}")
s1=$(date +%s.%N); "${ctl[@]}" add-server "${a[2]}" >"$tmp/add.json" || { echo "add-server failed"; cat "$tmp/add.json"; }
e1=$(date +%s.%N)
sleep 5
s2=$(date +%s.%N); "${ctl[@]}" remove-server "${a[2]}" >"$tmp/remove.json" || { echo "remove-server failed"; cat "$tmp/remove.json"; }
e2=$(date +%s.%N)
sleep 2
touch "$tmp/stop"; wait $pusher; echo "pushers: exit $? $(tail -1 "$tmp/push.log")"
"$drv" check "$tmp/push.hist"
# The sources' own times per batch (their "move ...: sent" log lines): snapshot export and
# install (while updates go on), then freeze, export and install under the freeze.
cat "$tmp"/ps*.log | python3 -c '
import re, sys
pre = re.compile(r"snapshot (\d+) bytes, \d+ rows: export ([\d.]+) ms, install ([\d.]+) ms; frozen "
                 r"(\d+) bytes, \d+ rows: freeze ([\d.]+) ms, export ([\d.]+) ms, install ([\d.]+) ms")
old = re.compile(r"freeze ([\d.]+) ms, export ([\d.]+) ms, install ([\d.]+) ms\)")
lines = sys.stdin.read().splitlines()
p = [list(map(float, m.groups())) for m in map(pre.search, lines) if m]
o = [list(map(float, m.groups())) for m in map(old.search, lines) if m]
if o and not p:
    n = len(o); mean = lambda i: sum(x[i] for x in o) / n
    print(f"sources, mean of {n} batches (all under the freeze): freeze {mean(0):.1f} ms, "
          f"export {mean(1):.1f} ms, install {mean(2):.1f} ms")
if p:
    n = len(p); mean = lambda i: sum(x[i] for x in p) / n
    print(f"sources, mean of {n} batches: snapshot export {mean(1):.1f} ms, install {mean(2):.1f} ms; "
          f"frozen: freeze {mean(4):.1f} ms, export {mean(5):.1f} ms, install {mean(6):.1f} ms "
          f"(longest export + install {max(x[5] + x[6] for x in p):.1f} ms)")
'
# ps-bench's 1 MiB push rate on this machine, for the copy rate.
mib=$("$build/bench/ps-bench" --server-bin "$bin" --sizes 1M --servers 1 --ops push --seconds 3 \
  --no-variants 2>/dev/null | grep -i "push" | head -n 3)
echo "ps-bench 1 MiB push:"; echo "$mib"
python3 - "$tmp/push.lat" "$rows" "$tmp/add.json" "$s1" "$e1" "$tmp/remove.json" "$s2" "$e2" <<'PY'
import json, sys
lat = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
rows = int(sys.argv[2])
row_bytes = 8 + 8 + 4 * 16 * 2  # id, update time, parameters, Adagrad accumulators
def report(name, path, s, e):
    s, e = float(s), float(e)
    lines = [json.loads(l) for l in open(path) if l.startswith("{")]
    done = [d for d in lines if d.get("done")]
    batches = [d["ms"] for d in lines if "ms" in d]
    wins = [d.get("windows", 0) for d in lines if "ms" in d]
    sizes = [d["bytes"] for d in lines if "ms" in d]
    moved = done[0]["bytes"] if done else 0
    before = sorted(ms for t, ms in lat if t < s)
    p99 = before[int(0.99 * (len(before) - 1))] if before else float("nan")
    during = [ms for t, ms in lat if s <= t <= e]
    print(f"{name}: {moved} bytes moved in {e - s:.2f} s ({moved / (e - s) / 2**20:.1f} MiB/s); "
          f"a third of the table: {rows * row_bytes / 3:.0f} bytes; "
          f"pushes before: {len(before)}, p99 {p99:.2f} ms; during: {len(during)}, "
          f"longest {max(during) if during else float('nan'):.2f} ms")
    if batches:
        print(f"  {len(batches)} batches, mean ms per batch: " +
              ", ".join(f"{k} {sum(b[k] for b in batches) / len(batches):.1f}"
                        for k in ("record", "send", "flip", "commit")) +
              f"; exactly-once windows per batch {max(wins)} (of {max(sizes)} bytes at most)")
        frozen = [b.get("frozen", 0) for b in batches]
        snap = sum(d.get("snapshot_bytes", 0) for d in lines if "ms" in d)
        froz = sum(d.get("frozen_bytes", 0) for d in lines if "ms" in d)
        print(f"  frozen per batch (source's freeze of the SEND + flip + COMMITs): mean "
              f"{sum(frozen) / len(frozen):.1f} ms, longest {max(frozen):.1f} ms; bytes sent "
              f"before the freeze {snap}, under it {froz}" if any(frozen) else
              "  (no pre-copy figures: a psctl or servers without them)")
report("add-server", sys.argv[3], sys.argv[4], sys.argv[5])
report("remove-server", sys.argv[6], sys.argv[7], sys.argv[8])
PY
