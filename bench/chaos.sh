#!/usr/bin/env bash
# Many seeds of the randomized fault schedule (tests/integration/test_chaos.sh: 3 ps-servers,
# a real etcd, clients with identifiable pushes, kills, restarts, stops, cuts and etcd outages,
# then the exact checks) for MINUTES minutes: one run per seed and configuration, seeds drawn
# at random (or from $PSD_CHAOS_SEEDS, in order), each run's result on a line of LOG:
#   SEED REPLICAS SECONDS pass|FAIL|skip WALL_S [symptom]
# A failed run's whole output is kept as DIR/chaos-SEED-rREPLICAS.out (and its temporary
# directory, with every process's log, as the output's last line names).
#
#   bench/chaos.sh [BUILD_DIR [MINUTES [LOG]]]     (defaults: build 30 chaos-results/chaos.log)
#
# Environment: PSD_CHAOS_SECONDS (schedule length per run, default 60), PSD_CHAOS_REPLICAS
# (default "2 3"), PSD_CHAOS_SEEDS (a list of seeds to run instead of random ones),
# PSD_CHAOS_NETNS, PSD_ETCD (as the test takes them). Exit 0 when every run passed, 1 otherwise.
set -u
BUILD=${1:-build}
MINUTES=${2:-30}
LOG=${3:-chaos-results/chaos.log}
here=$(cd "$(dirname "$0")" && pwd)
test_sh=$here/../tests/integration/test_chaos.sh
for b in server/ps-server tests/replica_pusher tests/replica_checksums client/psctl; do
    [ -x "$BUILD/$b" ] || {
        echo "chaos.sh: $BUILD/$b missing (build first: meson compile -C $BUILD)" >&2
        exit 2
    }
done
mkdir -p "$(dirname "$LOG")"
dir=$(cd "$(dirname "$LOG")" && pwd)
secs=${PSD_CHAOS_SECONDS:-60}
read -r -a configs <<<"${PSD_CHAOS_REPLICAS:-2 3}"
read -r -a seeds <<<"${PSD_CHAOS_SEEDS:-}"
end=$(($(date +%s) + MINUTES * 60))
runs=0
failed=0
echo "# $(date -u +%FT%TZ) bench/chaos.sh: $MINUTES min, $secs s schedules, replicas ${configs[*]}" >>"$LOG"
k=0
while [ "$(date +%s)" -lt "$end" ]; do
    if [ "${#seeds[@]}" -gt 0 ]; then
        [ "$k" -lt "${#seeds[@]}" ] || break
        seed=${seeds[$k]}
    else
        seed=$(od -An -N3 -tu4 /dev/urandom | tr -d ' ')
    fi
    k=$((k + 1))
    for r in "${configs[@]}"; do
        [ "$(date +%s)" -lt "$end" ] || break
        out=$dir/chaos-$seed-r$r.out
        t0=$(date +%s)
        PS_TEST_KEEP_TMP=1 PSD_CHAOS_SEED=$seed PSD_CHAOS_REPLICAS=$r PSD_CHAOS_SECONDS=$secs \
            timeout $((secs * 3 + 600)) bash "$test_sh" "$BUILD/server/ps-server" \
            "$BUILD/tests/replica_pusher" "$BUILD/tests/replica_checksums" \
            "$BUILD/client/psctl" >"$out" 2>&1
        rc=$?
        wall=$(($(date +%s) - t0))
        runs=$((runs + 1))
        case $rc in
        0)
            result=pass
            # Passing runs keep nothing: their temporary directory goes too.
            kept=$(sed -n 's/^kept \(.*\) (PS_TEST_KEEP_TMP=1)$/\1/p' "$out")
            [ -z "$kept" ] || rm -rf "$kept"
            rm -f "$out"
            ;;
        77) result=skip ;;
        *)
            result=FAIL
            failed=$((failed + 1))
            ;;
        esac
        symptom=
        [ "$result" = FAIL ] && symptom=$(grep -m1 '^FAIL' "$out" || echo "exit $rc (timeout?)")
        echo "$seed $r $secs $result $wall $symptom" | tee -a "$LOG"
    done
done
echo "# $runs runs, $failed failed" | tee -a "$LOG"
[ "$failed" = 0 ]
