#!/usr/bin/env bash
# A move is durable on its target: two servers with a checkpoint-dir each hold variables and
# table rows that 2 client threads pushed; a third server joins (with a checkpoint-dir too),
# psctl add-server gives it a share of the slots, and it is killed -9 right after, before any
# checkpoint of its own was due. Restarted, it restores the slots moved to it (the install
# made them durable before the map gave them there), and every value equals the sum of the
# pushes acknowledged. Skipped (77) without etcd.
# Usage: test_slot_durable.sh PS_SERVER PSCTL SLOT_MOVE_PUSHER
set -u
bin=$1 psctl=$2 pusher=$3
fail=0
# shellcheck source=../support/cli_etcd.sh
. "$(dirname "$0")/../support/cli_etcd.sh"
etcd_setup slot-durable

a=(); for i in 0 1 2; do a+=("127.0.0.1:$(port)"); done
spec="{\"ps\":[\"${a[0]}\",\"${a[1]}\"]}"
pfx=/psd-slot-durable
ck=(--checkpoint-interval-s 3600 --checkpoint-interval-updates 0)
for i in 0 1; do
  "$bin" --cluster "$spec" --task ps:$i --coordinator "$coord" --coordinator-prefix $pfx \
    --checkpoint-dir "$tmp/ck$i" "${ck[@]}" 2>>"$tmp/ps$i.log" &
  pids+=($!)
done
for i in 0 1; do
  wait_log "$tmp/ps$i.log" "serving on" 15 || { echo "FAIL ps$i did not start"; cat "$tmp/ps$i.log"; exit 1; }
done
ctl=("$psctl" --cluster "$spec" --coordinator "$coord" --coordinator-prefix $pfx)

export TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" PS_COORDINATOR_PREFIX=$pfx
export PS_RETRIES=100 PS_DEADLINE_MS=60000
"$pusher" push "$tmp/hist" "$tmp/stop" >"$tmp/push.log" 2>&1 &
pusher_pid=$!; pids+=($pusher_pid)
sleep 2
touch "$tmp/stop"
if wait $pusher_pid; then echo "ok   pushers: $(tail -1 "$tmp/push.log")"
else echo "FAIL pushers:"; cat "$tmp/push.log"; fail=1; fi

join=("$bin" --cluster "$spec" --join --listen "tcp://${a[2]}" --coordinator "$coord"
      --coordinator-prefix $pfx --checkpoint-dir "$tmp/ck2" "${ck[@]}")
"${join[@]}" 2>>"$tmp/ps2.log" &
p2=$!; pids+=($p2)
wait_log "$tmp/ps2.log" "serving on" 15 || { echo "FAIL the joining server did not start"; cat "$tmp/ps2.log"; exit 1; }
check add-server 0 "add-server: done" "${ctl[@]}" --batch-slots 512 add-server "${a[2]}"
check install-durable 0 "durable in checkpoint" grep "are durable in checkpoint" "$tmp/ps2.log"
kill -9 $p2; wait $p2 2>/dev/null
"${join[@]}" 2>>"$tmp/ps2b.log" &
pids+=($!)
wait_log "$tmp/ps2b.log" "serving on" 15 || { echo "FAIL the joined server did not restart"; cat "$tmp/ps2b.log"; exit 1; }
check restored 0 "restores its slots" grep "restores its slots" "$tmp/ps2b.log"
check exact 0 "equals its acknowledged pushes" "$pusher" check "$tmp/hist"
[ $fail -eq 0 ] || { for f in ps0 ps1 ps2 ps2b; do echo "--- $f"; tail -20 "$tmp/$f.log"; done; }
exit $fail
