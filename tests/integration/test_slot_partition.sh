#!/usr/bin/env bash
# A network partition between the source and the target of a slot move, with real processes:
# two servers (replicas 1, a real etcd) and a third that joined; client threads push known
# increments throughout. ps 0 runs as the user nobody, so that an iptables rule on loopback
# (OUTPUT, owner nobody, to ps 2's port: DROP) cuts ps 0 off from ps 2 only: clients, psctl
# and ps 1 still reach both. psctl add-server ps 2 moves slots in batches; once its first batch
# is done the cable is cut, and held until psctl has exited (longer than the install's 20 s
# deadline):
#   - psctl exits 1 naming the batch rolled back (ps 0 could not reach ps 2), the map never
#     gives a slot to two servers or to none, and ps 0 serves its slots again (the pushes go
#     on, every one acknowledged);
#   - once healed, a rerun of psctl add-server completes the move;
#   - then ps 0 or ps 1 is cut off from everyone (its port DROPped: clients and psctl too) while
#     psctl remove-server's first batch toward it is held on ps 2 (test-failpoint
#     slot-move-hold, ps 2 only): psctl, unable to reach the target after the SEND, rolls the
#     batch back (exit 1) rather than flip the map to a target that may have lost it, and a
#     rerun once healed empties ps 2;
#   - every value equals the sum of the pushes acknowledged (none lost, none applied twice).
# Skipped (77) when not root, without iptables (or its owner match), the user nobody or etcd.
# Usage: test_slot_partition.sh PS_SERVER PSCTL SLOT_MOVE_PUSHER
set -u
bin=$1 psctl=$2 pusher=$3
fail=0
skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "not root (the partition is an iptables rule)"
command -v iptables >/dev/null || skip "no iptables"
command -v setpriv >/dev/null || skip "no setpriv (ps 0 runs as nobody)"
nobody=$(id -u nobody 2>/dev/null) || skip "no user nobody"
ipt() { iptables -w 10 "$@"; }
# shellcheck source=../support/cli_etcd.sh
. "$(dirname "$0")/../support/cli_etcd.sh"
etcd_setup slot-partition
chmod 755 "$tmp"

a=(); for i in 0 1 2; do a+=("127.0.0.1:$(port)"); done
rule=(OUTPUT -o lo -p tcp -d 127.0.0.1 --dport "${a[2]##*:}" -m owner --uid-owner "$nobody" -j DROP)
ipt -C "${rule[@]}" 2>/dev/null
[ $? -le 1 ] || skip "iptables cannot match on the owner here: $(ipt -C "${rule[@]}" 2>&1)"
cutting=() # the rule in place, if any
cut_off() { # RULE...
  ipt -I "$@" && cutting=("$@")
}
heal() {
  [ ${#cutting[@]} -gt 0 ] && ipt -D "${cutting[@]}" && cutting=()
  return 0
}
trap 'heal; etcd_cleanup' EXIT

spec="{\"ps\":[\"${a[0]}\",\"${a[1]}\"]}"
pfx=/psd-slot-partition
run0=(setpriv --reuid="$nobody" --regid="$(id -g nobody)" --clear-groups)
for i in 0 1; do
  as=(); [ $i = 0 ] && as=("${run0[@]}")
  "${as[@]}" "$bin" --cluster "$spec" --task ps:$i --coordinator "$coord" \
    --coordinator-prefix $pfx 2>>"$tmp/ps$i.log" &
  pids+=($!)
done
for i in 0 1; do
  wait_log "$tmp/ps$i.log" "serving on" 15 || { echo "FAIL ps$i did not start"; cat "$tmp/ps$i.log"; exit 1; }
done
"$bin" --cluster "$spec" --join --listen "tcp://${a[2]}" --coordinator "$coord" \
  --coordinator-prefix $pfx --test-failpoint slot-move-hold 2>>"$tmp/ps2.log" &
pids+=($!)
wait_log "$tmp/ps2.log" "serving on" 15 || { echo "FAIL ps2 did not start"; cat "$tmp/ps2.log"; exit 1; }
ctl0=("$psctl" --cluster "$spec" --coordinator "$coord" --coordinator-prefix "$pfx")
ctl=("${ctl0[@]}" --batch-slots 128)

export TF_CONFIG="{\"cluster\":$spec}" PS_COORDINATOR="$coord" PS_COORDINATOR_PREFIX=$pfx
export PS_RETRIES=100 PS_DEADLINE_MS=120000
"$pusher" push "$tmp/hist" "$tmp/stop" >"$tmp/push.log" 2>&1 &
pusher_pid=$!; pids+=("$pusher_pid")
sleep 1

# One slot map, every slot on one server: the three counts add up to S.
one_owner() { # NAME
  local s
  s=$("${ctl0[@]}" slots 2>&1)
  local sum
  sum=$(awk -v l="${a[*]}" 'BEGIN {split(l, x, " "); for (i in x) own[x[i]] = 1}
    own[$2] {n += $3} END {print n + 0}' <<<"$s")
  if [ "$sum" = 4096 ]; then echo "ok   $1: every slot has one owner"
  else echo "FAIL $1: the servers' slots add up to $sum, not 4096: $s"; fail=1; fi
}

"${ctl[@]}" add-server "${a[2]}" >"$tmp/add1.log" 2>"$tmp/add1.err" &
ctl_pid=$!
wait_log "$tmp/add1.log" "^batch 1/" 60 || { echo "FAIL no batch moved within 60 s"; fail=1; }
cut_off "${rule[@]}"
echo "ok   ps 0 cut off from ps 2 ($(date +%T))"
t0=$(date +%s)
if wait $ctl_pid; then
  echo "FAIL add-server across the partition exited 0"; cat "$tmp/add1.log" "$tmp/add1.err"; fail=1
else
  check partition-clear 0 "from ps 0 .* to ps 2 .* failed: .*rolled back, they stay on ps 0" cat "$tmp/add1.err"
fi
echo "ok   psctl exited after $(($(date +%s) - t0)) s of partition"
check partition-no-record 0 "moves in progress: none" "${ctl0[@]}" slots
one_owner partitioned
# Still cut off, ps 0 serves its slots again: a second client's pushes, to every variable and
# row, are all acknowledged within 60 s.
"$pusher" push "$tmp/hist-cut" "$tmp/stop-cut" >"$tmp/push-cut.log" 2>&1 &
cut_pid=$!; pids+=("$cut_pid")
sleep 3
touch "$tmp/stop-cut"
for _ in $(seq 600); do kill -0 $cut_pid 2>/dev/null || break; sleep 0.1; done
if kill -0 $cut_pid 2>/dev/null; then echo "FAIL pushes during the partition still waiting after 60 s"; fail=1
elif wait $cut_pid; then echo "ok   pushes during the partition: $(cat "$tmp/push-cut.log")"
else echo "FAIL pushes during the partition:"; cat "$tmp/push-cut.log"; fail=1; fi
heal
echo "ok   healed ($(date +%T))"
check partition-rerun 0 "add-server: done" "${ctl[@]}" add-server "${a[2]}"
one_owner healed
check partition-moved 0 "${a[2]} *136[56] " "${ctl0[@]}" slots

# The target cut off from everyone (its port DROPped for every process: clients and psctl too)
# while psctl remove-server's first batch is held on its source, ps 2 (test-failpoint
# slot-move-hold, 3 s once the target installed it): psctl cannot reach the target after the
# SEND, so it cannot tell whether the target still holds the batch, and rolls it back (exit 1)
# rather than flip the map; a rerun once healed completes.
held=$(grep -c "slot-move-hold: holding" "$tmp/ps2.log")
"${ctl0[@]}" --batch-slots 4096 remove-server "${a[2]}" >"$tmp/remove1.log" 2>&1 &
ctl_pid=$!
for _ in $(seq 600); do
  [ "$(grep -c "slot-move-hold: holding" "$tmp/ps2.log")" -gt "$held" ] && break
  sleep 0.1
done
k=$(grep "slot-move-hold: holding" "$tmp/ps2.log" | tail -1 | sed -n 's/.*installed on ps \([01]\),.*/\1/p')
if [ -z "$k" ]; then echo "FAIL no batch of remove-server was held within 60 s"; fail=1
else
  cut_off OUTPUT -o lo -p tcp -d 127.0.0.1 --dport "${a[k]##*:}" -j DROP
  echo "ok   ps $k cut off from everyone ($(date +%T))"
fi
t0=$(date +%s)
if wait $ctl_pid; then echo "FAIL remove-server with its target cut off exited 0"; cat "$tmp/remove1.log"; fail=1
else check target-cut-clear 0 "the target stopped answering once it had installed them.*rolled back, they stay on ps 2" cat "$tmp/remove1.log"; fi
echo "ok   psctl exited after $(($(date +%s) - t0)) s of partition"
one_owner target-cut
heal
echo "ok   healed ($(date +%T))"
check target-cut-rerun 0 "remove-server: done" "${ctl0[@]}" --batch-slots 4096 remove-server "${a[2]}"
one_owner target-cut-healed
check target-cut-emptied 0 "${a[2]} *0 " "${ctl0[@]}" slots
touch "$tmp/stop"
if wait $pusher_pid; then echo "ok   pushers: $(cat "$tmp/push.log")"
else echo "FAIL pushers:"; cat "$tmp/push.log"; fail=1; fi
check exact 0 "equals its acknowledged pushes" "$pusher" check "$tmp/hist" "$tmp/hist-cut"
[ $fail -eq 0 ] || { for i in 0 1 2; do echo "--- ps$i"; tail -30 "$tmp/ps$i.log"; done; cat "$tmp/add1.log" "$tmp/add1.err" "$tmp/remove1.log"; }
exit $fail
