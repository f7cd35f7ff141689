#!/usr/bin/env bash
# A table push cut twice across consecutive slot moves toward one server: psctl add-server
# moves slots in batches of 8 while 2 client threads push to table rows (32 ids spread over
# the table a push: most pushes refused after a batch are cut) and 2 more send Steps. The servers run with test-failpoint slot-cut-hold: the piece of a refused
# push that stays on its server (same client id and seq) waits 1.5 s there before the gate, so
# the next batches move some of its rows away meanwhile and it is refused and cut again, its
# rows sent on to the new server where a piece of the same push went already. Every piece must
# be applied once there: every value then equals the sum of the pushes acknowledged. Skipped
# (77) without etcd.
# With MODE lost-replies instead, the servers drop 10% of push replies after applying the push
# (test-drop-reply-percent; the clients resend after 300 ms): a push applied on its server
# whose rows then move is resent there, and must be answered from the exactly-once window
# (applied once), never refused as moved and applied again on the new server.
# Usage: test_slot_cut.sh PS_SERVER PSCTL SLOT_MOVE_PUSHER [cut|lost-replies]
set -u
bin=$1 psctl=$2 pusher=$3 mode=${4:-cut}
fail=0
# shellcheck source=../support/cli_etcd.sh
. "$(dirname "$0")/../support/cli_etcd.sh"
etcd_setup slot-cut

a=(); for i in 0 1 2; do a+=("127.0.0.1:$(port)"); done
spec="{\"ps\":[\"${a[0]}\",\"${a[1]}\"]}"
pfx=/psd-slot-cut
hold=(--test-failpoint slot-cut-hold)
[ "$mode" = lost-replies ] && hold=(--test-drop-reply-percent 10)
for i in 0 1; do
  "$bin" --cluster "$spec" --task ps:$i --coordinator "$coord" --coordinator-prefix $pfx "${hold[@]}" 2>>"$tmp/ps$i.log" &
  pids+=($!)
done
for i in 0 1; do
  wait_log "$tmp/ps$i.log" "serving on" 15 || { echo "FAIL ps$i did not start"; cat "$tmp/ps$i.log"; exit 1; }
done
ctl=("$psctl" --cluster "$spec" --coordinator "$coord" --coordinator-prefix $pfx)

export TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" PS_COORDINATOR_PREFIX=$pfx
export PS_RETRIES=100 PS_DEADLINE_MS=60000
[ "$mode" = lost-replies ] && export PS_RESEND_MS=300
SLOT_PUSHER_IDS=32 "$pusher" push "$tmp/hist" "$tmp/stop" >"$tmp/push.log" 2>&1 &
pusher_pid=$!; pids+=($pusher_pid)
PS_WORKER_ID=0 PS_HEARTBEAT_MS=200 "$pusher" step "$tmp/hist2" "$tmp/stop" >"$tmp/step.log" 2>&1 &
stepper_pid=$!; pids+=($stepper_pid)
"$bin" --cluster "$spec" --join --listen "tcp://${a[2]}" --coordinator "$coord" \
  --coordinator-prefix $pfx "${hold[@]}" 2>>"$tmp/ps2.log" &
pids+=($!)
wait_log "$tmp/ps2.log" "serving on" 15 || { echo "FAIL the joining server did not start"; cat "$tmp/ps2.log"; exit 1; }
sleep 1
check add-server 0 "add-server: done" "${ctl[@]}" --batch-slots 8 add-server "${a[2]}"
sleep 1
touch "$tmp/stop"
if wait $pusher_pid; then echo "ok   pushers: $(tail -1 "$tmp/push.log")"
else echo "FAIL pushers:"; cat "$tmp/push.log"; fail=1; fi
if wait $stepper_pid; then echo "ok   steps: $(tail -1 "$tmp/step.log")"
else echo "FAIL steps:"; cat "$tmp/step.log"; fail=1; fi
check exact 0 "equals its acknowledged pushes" "$pusher" check "$tmp/hist" "$tmp/hist2"
if [ "$mode" = lost-replies ]; then
  # The servers log what they dropped as they stop.
  # Only running jobs: a reaped child's number may be another process's now.
  for p in $(jobs -rp); do kill -TERM "$p" 2>/dev/null; done; wait "${pids[@]}" 2>/dev/null
  dropped=$(sed -n 's/.*, \([0-9]*\) push replies dropped after applying.*/\1/p' "$tmp"/ps[0-9].log |
    awk '{n += $1} END {print n + 0}')
  if [ "$dropped" -gt 0 ]; then echo "ok   $dropped push replies dropped after applying, every push applied once"
  else echo "FAIL no push reply was dropped: the fault was not injected"; fail=1; fi
else
  echo "     pieces held after a refusal: $(cat "$tmp"/ps[0-9].log | grep -c "failpoint slot-cut-hold: holding")"
fi
[ $fail -eq 0 ] || { for i in 0 1 2; do echo "--- ps$i"; tail -20 "$tmp/ps$i.log"; done; }
exit $fail
