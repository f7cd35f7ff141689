#!/usr/bin/env bash
# TensorBoard event files of a real cluster, read by TensorBoard's own reader.
#
#   test_events.sh PS_SERVER PS_WORKER PS_LOCAL SOURCE_ROOT
#
# 1. ps-local --logdir: 1 ps-server and 2 ps-workers train 60 steps; TensorBoard's
#    event_accumulator (tests/support/tb_check.py) loads DIR/worker-0, DIR/worker-1 and
#    DIR/ps-0 and finds the expected tags, the workers' values equal to their JSON log lines'
#    (loss, accuracy, samples/s, step time, staleness, test accuracy), weight and gradient
#    histograms, the server's request rates and percentiles; psd.events (the Python writer)
#    likewise.
# 2. An unusable directory is a clear error at start, exit 2, for ps-local --logdir,
#    ps-worker --logdir and ps-server --events-dir.
# 3. A disk that fills mid-run (a 64 KiB tmpfs; as root only, else that part is skipped with
#    its reason): training finishes (exit 0), each process logs one error about its event
#    files, and every file left holds whole records only.
#
# Exit 77 (skipped) without Fashion-MNIST or without the venv with the tensorboard package
# (deploy/setup.sh --test makes it in /opt/psd-tb-venv; PSD_TB_VENV names another).
set -u
PS_SERVER=${1:?ps-server}
PS_WORKER=${2:?ps-worker}
PS_LOCAL=${3:?ps-local}
SRC=${4:?source root}
DATA_DIR=${PS_TEST_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
VENV=${PSD_TB_VENV:-/opt/psd-tb-venv}
# shellcheck source=../support/procs.sh
. "$SRC/tests/support/procs.sh"

if [ ! -r "$DATA_DIR/train-images-idx3-ubyte.gz" ] && [ ! -r "$DATA_DIR/train-images-idx3-ubyte" ]; then
    echo "SKIP: Fashion-MNIST not found in $DATA_DIR (apt-get install dataset-fashion-mnist)"
    exit 77
fi
if ! "$VENV/bin/python" -c "import tensorboard.backend.event_processing.event_accumulator" 2>/dev/null; then
    echo "SKIP: no venv with the tensorboard package at $VENV (deploy/setup.sh --test makes it;" \
        "PSD_TB_VENV names another)"
    exit 77
fi
PY="$VENV/bin/python"
CHECK="$SRC/tests/support/tb_check.py"
export PYTHONPATH="$SRC/client/python"

tmp=$(mktemp -d /tmp/ps-test-events-XXXXXX)
small=
cleanup_mount() {
    if [ -n "$small" ] && mountpoint -q "$small" 2>/dev/null; then
        umount "$small" 2>/dev/null
    fi
}
procs_on_exit cleanup_mount

worker_args=(--layers "784,32,10" --batch-size 64 --steps 60 --log-every 20 --events-every 20
    --eval-every 30 --histogram-every 30 --log-format json --data-dir "$DATA_DIR")

# ---- 1. a cluster's run directories ----
"$PS_LOCAL" --ps 1 --workers 2 --timeout 90 --logdir "$tmp/logs" \
    --server-arg=--events-interval-s=1 -- "${worker_args[@]}" --model-name ev_mlp \
    >"$tmp/run.out" 2>"$tmp/run.log" &
pids+=($!)
wait_for "$!" 100
rc=$?
[ "$rc" -eq 0 ] || fail "ps-local --logdir exited $rc"
"$PY" "$CHECK" cluster "$tmp/logs" "$tmp/run.log" 2>"$tmp/check.log" ||
    fail "TensorBoard's reader: $(head -c 3000 "$tmp/check.log")"
"$PY" "$CHECK" python "$tmp/logs" "$SRC/client/python" 2>"$tmp/check-py.log" ||
    fail "psd.events read by TensorBoard: $(head -c 3000 "$tmp/check-py.log")"
echo "cluster and Python event files read by TensorBoard: ok"

# ---- 2. unusable directories ----
: >"$tmp/plain"
"$PS_LOCAL" --logdir "$tmp/plain/logs" -- --steps 1 >/dev/null 2>"$tmp/bad-local.log"
rc=$?
[ "$rc" -eq 2 ] || fail "ps-local --logdir under a file exited $rc, expected 2"
grep -q -- "--logdir: cannot create $tmp/plain/logs: Not a directory" "$tmp/bad-local.log" ||
    fail "ps-local --logdir: no clear message"
tf='{"cluster":{"ps":["127.0.0.1:1"],"worker":["127.0.0.1:2"]},"task":{"type":"worker","index":0}}'
TF_CONFIG=$tf "$PS_WORKER" "${worker_args[@]}" --logdir "$tmp/plain/logs" >/dev/null \
    2>"$tmp/bad-worker.log"
rc=$?
[ "$rc" -eq 2 ] || fail "ps-worker --logdir under a file exited $rc, expected 2"
grep -q "cannot create $tmp/plain/logs" "$tmp/bad-worker.log" ||
    fail "ps-worker --logdir: no clear message"
tf='{"cluster":{"ps":["127.0.0.1:1"],"worker":["127.0.0.1:2"]},"task":{"type":"ps","index":0}}'
TF_CONFIG=$tf "$PS_SERVER" --events-dir "$tmp/plain/logs" --log-format json >/dev/null \
    2>"$tmp/bad-server.log"
rc=$?
[ "$rc" -eq 2 ] || fail "ps-server --events-dir under a file exited $rc, expected 2"
grep -q "events-dir: cannot create $tmp/plain/logs" "$tmp/bad-server.log" ||
    fail "ps-server --events-dir: no clear message"
echo "unusable directories: exit 2 with a clear message: ok"

# ---- 3. a disk that fills mid-run ----
small="$tmp/small"
mkdir -p "$small"
if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP (part 3): a full disk needs a tmpfs mount, and this test is not root"
elif ! mount -t tmpfs -o size=64k tmpfs "$small" 2>"$tmp/mount.log"; then
    echo "SKIP (part 3): mount -t tmpfs not permitted here: $(cat "$tmp/mount.log")"
else
    "$PS_LOCAL" --ps 1 --workers 2 --timeout 90 --logdir "$small" \
        --server-arg=--events-interval-s=1 -- "${worker_args[@]}" --histogram-every 1 \
        --events-every 1 --model-name ev_full >"$tmp/full.out" 2>"$tmp/full.log" &
    pids+=($!)
    wait_for "$!" 100
    rc=$?
    [ "$rc" -eq 0 ] || fail "training with a full log disk exited $rc, expected 0"
    grep -q "test_accuracy=" "$tmp/full.out" || fail "full disk: no test accuracy"
    n=$(grep -c "event files in $small/worker-0 stop" "$tmp/full.log")
    [ "$n" -eq 1 ] || fail "full disk: worker 0 logged $n errors about its event files, expected 1"
    n=$(grep -c "event files in $small/worker-1 stop" "$tmp/full.log")
    [ "$n" -le 1 ] || fail "full disk: worker 1 logged $n errors about its event files"
    "$PY" "$CHECK" whole "$small" 2>"$tmp/check-full.log" ||
        fail "full disk: files not whole: $(head -c 3000 "$tmp/check-full.log")"
    umount "$small"
    echo "full disk: one error, training finished, whole records only: ok"
fi
echo "PASS"
