#!/usr/bin/env bash
# psd.torch through ps-local: client/python/examples/torch_attach.py as 2 workers in one
# command (1 ps), BSP, one epoch: both workers finish, worker 0 alone prints test_accuracy and
# it reaches MIN_ACCURACY; then the same with --no-overlap (pushes after backward) and
# --staleness -1 (push-pull from the hooks).
#
#   test_torch_attach.sh PS_LOCAL EXAMPLES_DIR
#
# Exit 77 (skipped) without /usr/bin/python3 with NumPy and PyTorch, or without Fashion-MNIST.
set -u
PS_LOCAL=${1:?ps-local}
EXAMPLES=${2:?examples directory}
PY=/usr/bin/python3
DATA_DIR=${PS_TEST_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
# shellcheck source=../support/procs.sh
. "$(cd "$(dirname "$0")" && pwd)/../support/procs.sh"

if ! "$PY" -c 'import numpy, torch' 2>/dev/null; then
    echo "SKIP: $PY has no NumPy or no PyTorch (apt-get install python3-numpy python3-torch)"
    exit 77
fi
if [ ! -r "$DATA_DIR/train-images-idx3-ubyte.gz" ] && [ ! -r "$DATA_DIR/train-images-idx3-ubyte" ]; then
    echo "SKIP: Fashion-MNIST not found in $DATA_DIR (apt-get install dataset-fashion-mnist)"
    exit 77
fi
tmp=$(mktemp -d /tmp/ps-test-torch-attach-XXXXXX)
procs_on_exit
unset PSD_LIBRARY # ps-local points the Python workers at the build's libpsclient
# One epoch reaches about 0.83 on a quiet machine; the asynchronous run varies from run to
# run and with load (0.774 beside other work, 0.776 once on a quiet machine), since which
# gradients are stale depends on timing. 0.70 leaves room for that spread and is still far
# above chance (0.10), which a model that did not train stays near.
MIN_ACCURACY=0.70

run() { # run NAME WORKER-ARGS...
    local name=$1
    shift
    "$PS_LOCAL" --timeout 170 --workers 2 --worker "$EXAMPLES/torch_attach.py" -- \
        --epochs 1 --data-dir "$DATA_DIR" --prefix "ta_$name/" "$@" \
        >"$tmp/$name.out" 2>"$tmp/$name.log" &
    local l=$!
    pids+=("$l")
    wait_for "$l" 180
    local rc=$?
    [ "$rc" -eq 0 ] || fail "$name: ps-local exited $rc: $(tail -n 20 "$tmp/$name.log")"
    [ "$(grep -c 'test_accuracy=' "$tmp/$name.out")" -eq 1 ] ||
        fail "$name: expected one test_accuracy= line (worker 0's): $(cat "$tmp/$name.out")"
    local acc
    acc=$(accuracy_of "$tmp/$name.out")
    awk -v a="$acc" -v m="$MIN_ACCURACY" 'BEGIN { exit !(a >= m) }' ||
        fail "$name: test accuracy $acc < $MIN_ACCURACY"
    for i in 0 1; do
        grep -q "worker $i trained 234 steps in" "$tmp/$name.log" ||
            fail "$name: worker $i did not train its 234 steps: $(tail -n 20 "$tmp/$name.log")"
    done
    grep -q 'all 2 worker(s) finished' "$tmp/$name.log" || fail "$name: not every worker finished"
    echo "$name: $(cat "$tmp/$name.out")"
}
run bsp
run sequential --no-overlap
run async --staleness -1
echo "PASS"
