#!/usr/bin/env bash
# Slot moves pre-copy each batch (docs/design.md, "Moving slots"): the source sends a snapshot
# of the batch while updates go on, then freezes it and sends only what changed since.
# 1. `psctl --json remove-server` while 2 client threads push to variables held whole and to
#    table rows: every batch went in two steps (snapshot bytes and frozen bytes both reported,
#    the targets staged each snapshot), and every value then equals the sum of the pushes
#    acknowledged (a row changed between a snapshot and its freeze arrives with its final
#    value; none lost, none applied twice).
# 2. `psctl --json add-server` of it again with no update going on: the freezes carry no row
#    (frozen_rows 0 in every batch), and the frozen bytes are the snapshot bytes less each
#    moved row's 24 bytes (id, update time, 2 floats) plus 8 bytes of id list per row, 8 per
#    table and batch, and the windows (528 bytes each at the default dedup-window, sent under
#    the freeze only): exactly. The values are still exact.
# Skipped (77) without etcd.
# Usage: test_slot_precopy.sh PS_SERVER PSCTL SLOT_MOVE_PUSHER
set -u
bin=$1 psctl=$2 pusher=$3
fail=0
# shellcheck source=../support/cli_etcd.sh
. "$(dirname "$0")/../support/cli_etcd.sh"
etcd_setup slot-precopy

a=(); for i in 0 1 2; do a+=("127.0.0.1:$(port)"); done
spec="{\"ps\":[\"${a[0]}\",\"${a[1]}\",\"${a[2]}\"]}"
pfx=/psd-slot-precopy
for i in 0 1 2; do
  "$bin" --cluster "$spec" --task ps:$i --coordinator "$coord" --coordinator-prefix $pfx 2>>"$tmp/ps$i.log" &
  pids+=($!)
done
for i in 0 1 2; do
  wait_log "$tmp/ps$i.log" "serving on" 15 || { echo "FAIL ps$i did not start"; cat "$tmp/ps$i.log"; exit 1; }
done
ctl=("$psctl" --cluster "$spec" --coordinator "$coord" --coordinator-prefix $pfx --json --batch-slots 256)
export TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" PS_COORDINATOR_PREFIX=$pfx
export PS_RETRIES=100 PS_DEADLINE_MS=60000 SLOT_PUSHER_IDS=8

# What psctl --json reported of a move's batches: "ok" or what is wrong. $1: the JSON lines,
# $2: "busy" (updates went on: both steps reported) or "idle" (the exact byte relation).
batches() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
b = [d for d in lines if "ms" in d]
if not b:
    sys.exit(print("no batch reported"))
for d in b:
    for k in ("snapshot_bytes", "frozen_bytes", "snapshot_rows", "frozen_rows"):
        if k not in d:
            sys.exit(print(f"batch {d['batch']}: no {k}: {d}"))
    if d["snapshot_bytes"] == 0 or d["frozen_bytes"] == 0:
        sys.exit(print(f"batch {d['batch']} was not pre-copied: {d}"))
    if d["bytes"] != d["snapshot_bytes"] + d["frozen_bytes"]:
        sys.exit(print(f"batch {d['batch']}: bytes is not snapshot + frozen: {d}"))
if sys.argv[2] == "idle":
    for d in b:
        want = d["snapshot_bytes"] - 24 * d["snapshot_rows"] + 8 * d["rows"] + 8 + 528 * d["windows"]
        if d["frozen_rows"] != 0 or d["rows"] != d["snapshot_rows"] or d["frozen_bytes"] != want:
            sys.exit(print(f"batch {d['batch']}: frozen {d['frozen_bytes']} bytes, "
                           f"{d['frozen_rows']} rows, want {want} bytes, 0 rows: {d}"))
snap = sum(d["snapshot_bytes"] for d in b)
froz = sum(d["frozen_bytes"] for d in b)
print(f"ok {len(b)} batches, snapshot {snap} bytes ({sum(d['snapshot_rows'] for d in b)} rows), "
      f"frozen {froz} bytes ({sum(d['frozen_rows'] for d in b)} rows)")
PY
}

# 1. remove-server under pushes.
"$pusher" push "$tmp/hist" "$tmp/stop" >"$tmp/push.log" 2>&1 &
pusher_pid=$!; pids+=($pusher_pid)
sleep 2
if "${ctl[@]}" remove-server "${a[2]}" >"$tmp/remove.json" 2>"$tmp/remove.err"; then
  echo "ok   remove-server"
else
  echo "FAIL remove-server: $(tail -5 "$tmp/remove.err")"; fail=1
fi
sleep 1
touch "$tmp/stop"
if wait $pusher_pid; then echo "ok   pushers: $(tail -1 "$tmp/push.log")"
else echo "FAIL pushers:"; cat "$tmp/push.log"; fail=1; fi
r=$(batches "$tmp/remove.json" busy)
case "$r" in ok*) echo "ok   remove-server pre-copied: ${r#ok }" ;; *) echo "FAIL remove-server batches: $r"; fail=1 ;; esac
staged=$(cat "$tmp/ps0.log" "$tmp/ps1.log" | grep -c "staged a snapshot of")
nb=$(grep -c '"ms"' "$tmp/remove.json")
if [ "$staged" -eq "$nb" ] && [ "$nb" -gt 0 ]; then echo "ok   the targets staged $staged snapshots"
else echo "FAIL the targets staged $staged snapshots for $nb batches"; fail=1; fi
check exact-remove 0 "equals its acknowledged pushes" "$pusher" check "$tmp/hist"

# 2. add-server with no update going on: the freezes carry no row.
if "${ctl[@]}" add-server "${a[2]}" >"$tmp/add.json" 2>"$tmp/add.err"; then
  echo "ok   add-server"
else
  echo "FAIL add-server: $(tail -5 "$tmp/add.err")"; fail=1
fi
r=$(batches "$tmp/add.json" idle)
case "$r" in ok*) echo "ok   add-server froze no row: ${r#ok }" ;; *) echo "FAIL add-server batches: $r"; fail=1 ;; esac
check exact-add 0 "equals its acknowledged pushes" "$pusher" check "$tmp/hist"
[ $fail -eq 0 ] || { for i in 0 1 2; do echo "--- ps$i"; tail -20 "$tmp/ps$i.log"; done; }
exit $fail
