#!/usr/bin/env bash
# Faults inside a slot move, with real processes: two servers (replicas 1, a real etcd, a
# checkpoint-dir each) and a third that joined; client threads push known increments. Each
# source runs with test-failpoint slot-move-hold, which holds every batch it sends for 3 s
# once the target installed it (frozen here, the map not flipped yet), so that each kill lands
# inside a batch:
#   - psctl add-server killed (-9) mid-batch: a rerun of the same command at once resumes from
#     <prefix>/moves/current (its psctl is gone), rolls the batch back and finishes the move;
#   - etcd stopped mid-batch (psctl remove-server): the move fails clearly (exit 1, the batch
#     left frozen and recorded), and a rerun once etcd is back finishes it;
#   - the source killed (-9) mid-batch (psctl add-server, after a checkpoint of every server):
#     psctl rolls the batch back (exit 1, the map unchanged), the source restarts from its
#     checkpoint, and a rerun finishes the move;
#   - the target killed (-9) mid-batch and restarted at once (psctl add-server, ps 2 holding
#     nothing else, pushes going on): the new process restored without the batch, so psctl
#     rolls it back (exit 1) rather than flip the map to it, and a rerun completes the move.
# After each, every value equals the sum of the pushes acknowledged (none lost, none applied
# twice). Then a cluster with replicas 2: psctl refuses to move its slots (exit 2), saying what
# to do instead. Skipped (77) without etcd.
# Usage: test_slot_faults.sh PS_SERVER PSCTL SLOT_MOVE_PUSHER
set -u
bin=$1 psctl=$2 pusher=$3
fail=0
# shellcheck source=../support/cli_etcd.sh
. "$(dirname "$0")/../support/cli_etcd.sh"
etcd_setup slot-faults
mapfile -d '' etcd_cmd </proc/$etcd_pid/cmdline # to restart it on the same ports and data

a=(); for i in 0 1 2; do a+=("127.0.0.1:$(port)"); done
spec="{\"ps\":[\"${a[0]}\",\"${a[1]}\"]}"
pfx=/psd-slot-faults
ck=(--checkpoint-interval-s 3600 --checkpoint-interval-updates 0)
hold=(--test-failpoint slot-move-hold)
start() { # task [more args]: ps0 and ps1 of the spec, ps2 joined
  local t=$1; shift
  if [ "$t" = 2 ]; then
    "$bin" --cluster "$spec" --join --listen "tcp://${a[2]}" --coordinator "$coord" \
      --coordinator-prefix $pfx --checkpoint-dir "$tmp/ck2" "${ck[@]}" "$@" 2>>"$tmp/ps2.log" &
  else
    "$bin" --cluster "$spec" --task ps:$t --coordinator "$coord" --coordinator-prefix $pfx \
      --checkpoint-dir "$tmp/ck$t" "${ck[@]}" "$@" 2>>"$tmp/ps$t.log" &
  fi
  pids+=($!); eval "ps${t}_pid=$!"
}
for i in 0 1; do start $i "${hold[@]}"; done
for i in 0 1; do
  wait_log "$tmp/ps$i.log" "serving on" 15 || { echo "FAIL ps$i did not start"; cat "$tmp/ps$i.log"; exit 1; }
done
start 2 "${hold[@]}"
wait_log "$tmp/ps2.log" "serving on" 15 || { echo "FAIL ps2 did not start"; cat "$tmp/ps2.log"; exit 1; }
ctl0=("$psctl" --cluster "$spec" --coordinator "$coord" --coordinator-prefix $pfx)
ctl=("${ctl0[@]}" --batch-slots 4096)

export TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" PS_COORDINATOR_PREFIX=$pfx
export PS_RETRIES=100 PS_DEADLINE_MS=60000
hists=()
run_pushers() { # name: pushes until $tmp/stop-name, history in $tmp/hist-name
  "$pusher" push "$tmp/hist-$1" "$tmp/stop-$1" >"$tmp/push-$1.log" 2>&1 &
  pusher_pid=$!; pids+=($pusher_pid)
}
end_pushers() { # name (the check sums every run's history: the runs push the same variables)
  touch "$tmp/stop-$1"
  hists+=("$tmp/hist-$1")
  if wait $pusher_pid; then echo "ok   pushers ($1): $(cat "$tmp/push-$1.log")"
  else echo "FAIL pushers ($1):"; cat "$tmp/push-$1.log"; fail=1; fi
  check "exact-$1" 0 "equals its acknowledged pushes" "$pusher" check "${hists[@]}"
}
wait_count() { # FILE TEXT N SECONDS: 0 once FILE has more than N lines with TEXT
  for _ in $(seq $(($4 * 10))); do
    [ "$(grep -c -- "$2" "$1" 2>/dev/null)" -gt "$3" ] && return 0
    sleep 0.1
  done
  return 1
}
holds() { grep -c "failpoint slot-move-hold: holding" "$tmp"/ps[0-9]*.log | awk -F: '{n += $2} END {print n + 0}'; }
wait_hold() { # the number of holds before: returns once a new one is logged
  for _ in $(seq 300); do [ "$(holds)" -gt "$1" ] && return 0; sleep 0.1; done
  echo "FAIL no batch was held within 30 s"; fail=1; return 1
}
held_move() { # LOG PSCTL-ARGS...: psctl in the background ($ctl_pid), returns once a batch is held
  local n log=$1; shift
  n=$(holds)
  "${ctl[@]}" "$@" >"$log" 2>&1 &
  ctl_pid=$!
  wait_hold "$n"
}

# psctl killed mid-batch: the rerun resumes at once and finishes.
run_pushers psctl
sleep 1
held_move "$tmp/add1.log" add-server "${a[2]}"
kill -9 $ctl_pid; wait $ctl_pid 2>/dev/null
check slots-shows-move 0 "moves in progress: move .* ps [01] -> ps 2, a batch of psctl add-server (0/1365 slots moved before it.*its psctl is gone" "${ctl0[@]}" slots
check psctl-rerun 0 "add-server: done" "${ctl[@]}" add-server "${a[2]}"
check psctl-resumed 0 "is gone: resuming it" echo "$out"
end_pushers psctl
check psctl-moved 0 "${a[2]} *[1-9][0-9]* " "${ctl0[@]}" slots

# etcd stopped mid-batch: psctl fails clearly, a rerun after it is back finishes.
run_pushers etcd
sleep 1
held_move "$tmp/remove1.log" remove-server "${a[2]}"
kill -9 $etcd_pid; wait $etcd_pid 2>/dev/null
if wait $ctl_pid; then echo "FAIL remove-server with etcd stopped exited 0"; cat "$tmp/remove1.log"; fail=1
else check etcd-down-clear 0 "stays frozen on ps 2" cat "$tmp/remove1.log"; fi
"${etcd_cmd[@]}" >>"$tmp/etcd.log" 2>&1 &
etcd_pid=$!; pids+=($etcd_pid)
for _ in $(seq 100); do "${ctl0[@]}" slots >/dev/null 2>&1 && break; sleep 0.1; done
check etcd-rerun 0 "remove-server: done" "${ctl[@]}" remove-server "${a[2]}"
end_pushers etcd
check etcd-emptied 0 "${a[2]} *0 " "${ctl0[@]}" slots

# The target killed mid-batch (the first batch, ps 2 holding nothing else: with replicas 1 what
# it acknowledged after its last checkpoint would be gone with it) and restarted at once, the
# pushes going on: psctl rolls the batch back (the new process restored without it), a rerun
# completes the move, values exact.
run_pushers target
sleep 1
held_move "$tmp/add-target.log" add-server "${a[2]}"
serving=$(grep -c "serving on" "$tmp/ps2.log")
kill -9 "$ps2_pid"; wait "$ps2_pid" 2>/dev/null
start 2 "${hold[@]}"
wait_count "$tmp/ps2.log" "serving on" "$serving" 30 || { echo "FAIL ps2 did not restart"; fail=1; }
if wait $ctl_pid; then echo "FAIL add-server with its target killed and restarted exited 0"; cat "$tmp/add-target.log"; fail=1
else check target-rolled-back 0 "the target \\(restarted during the batch\\|stopped answering once it had installed them\\).*rolled back" cat "$tmp/add-target.log"; fi
check target-rerun 0 "add-server: \\(done\\|nothing to move\\)" "${ctl[@]}" add-server "${a[2]}"
end_pushers target
check target-moved 0 "${a[2]} *[1-9][0-9]* " "${ctl0[@]}" slots
check target-emptied 0 "remove-server: done" "${ctl[@]}" remove-server "${a[2]}"

# The source killed mid-batch (after a checkpoint of every server, the pushes stopped: with
# replicas 1 what a killed server acknowledged after its last checkpoint is gone with it).
check checkpoint 0 "checkpoint: done" "${ctl0[@]}" checkpoint
before=$("${ctl0[@]}" slots | head -1)
h0=$(grep -c "slot-move-hold: holding" "$tmp/ps0.log")
held_move "$tmp/add2.log" add-server "${a[2]}"
src=1; [ "$(grep -c "slot-move-hold: holding" "$tmp/ps0.log")" -gt "$h0" ] && src=0
eval "kill -9 \$ps${src}_pid"
if wait $ctl_pid; then echo "FAIL add-server with its source killed exited 0"; cat "$tmp/add2.log"; fail=1
else check source-rolled-back 0 "rolled back" cat "$tmp/add2.log"; fi
after=$("${ctl0[@]}" slots | head -1)
if [ "$before" = "$after" ]; then echo "ok   map unchanged: $after"
else echo "FAIL map changed: $before -> $after"; fail=1; fi
start "$src"
wait_log "$tmp/ps$src.log" "serving on" 15 || { echo "FAIL ps$src did not restart"; fail=1; }
check source-exact 0 "equals its acknowledged pushes" "$pusher" check "${hists[@]}"
check source-rerun 0 "add-server: done" "${ctl[@]}" add-server "${a[2]}"
check source-moved-exact 0 "equals its acknowledged pushes" "$pusher" check "${hists[@]}"

# A cluster with replicas 2 moves no slot: psctl refuses (exit 2) saying what to do instead,
# whether it is given replicas or finds the cluster's view (and no slot map) in etcd.
r=("127.0.0.1:$(port)" "127.0.0.1:$(port)")
rspec="{\"ps\":[\"${r[0]}\",\"${r[1]}\"]}"
for i in 0 1; do
  "$bin" --cluster "$rspec" --task ps:$i --replicas 2 --coordinator "$coord" \
    --coordinator-prefix $pfx-r 2>>"$tmp/r$i.log" &
  pids+=($!)
done
wait_log "$tmp/r0.log" "view epoch 1" 30 || { echo "FAIL no view with replicas 2"; cat "$tmp/r0.log"; fail=1; }
rctl=("$psctl" --cluster "$rspec" --coordinator "$coord" --coordinator-prefix $pfx-r)
check replicas-view 2 "rebalance: replicas 2 (the view under $pfx-r in etcd .*replicas 1 only.*start the new servers once with replicas 1 on its checkpoint-dir (they restore and checkpoint), then with replicas 2" "${rctl[@]}" rebalance
check replicas-set 2 "add-server: replicas 2: slots move .*replicas 1 only.*then with replicas 2" "${rctl[@]}" --replicas 2 add-server "${r[1]}"
[ $fail -eq 0 ] || { for i in 0 1 2; do echo "--- ps$i"; tail -30 "$tmp/ps$i.log"; done; }
exit $fail
