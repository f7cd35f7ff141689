#!/usr/bin/env bash
# ps-local with Python workers (--worker FILE.py), with real processes on loopback.
#
#   test_launcher_python.sh PS_LOCAL EXAMPLES_DIR
#
# 1. A script that is not executable runs under --python (default /usr/bin/python3) with its
#    TF_CONFIG task and only the worker arguments (no --progress, which only ps-worker takes);
#    every line it writes on stderr is labelled with its role and task (JSON without a terminal,
#    "worker 1: ..." on one); the summary counts the workers that exited 0 although they wrote
#    no result line.
# 2. A worker that fails stops the cluster with its exit code; the summary counts no finished
#    worker. A missing script or interpreter is an exit-2 error before anything starts.
# 3. client/python/examples/mlp_numpy.py and torch_mlp.py (the latter skipped, saying so,
#    without PyTorch) as 2 workers in one command: each trains its half of the data, worker 0
#    alone prints test_accuracy (>= 0.75), and the summary has both workers and their samples/s.
#
# Exit 77 (skipped) without /usr/bin/python3 and NumPy, or without Fashion-MNIST.
set -u
PS_LOCAL=${1:?ps-local}
EXAMPLES=${2:?examples directory}
PY=/usr/bin/python3
DATA_DIR=${PS_TEST_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
# shellcheck source=../support/procs.sh
. "$(cd "$(dirname "$0")" && pwd)/../support/procs.sh"

if ! "$PY" -c 'import numpy' 2>/dev/null; then
    echo "SKIP: $PY has no NumPy (apt-get install python3-numpy)"
    exit 77
fi
if [ ! -r "$DATA_DIR/train-images-idx3-ubyte.gz" ] && [ ! -r "$DATA_DIR/train-images-idx3-ubyte" ]; then
    echo "SKIP: Fashion-MNIST not found in $DATA_DIR (apt-get install dataset-fashion-mnist)"
    exit 77
fi

tmp=$(mktemp -d /tmp/ps-test-launcher-python-XXXXXX)
procs_on_exit
unset PSD_LIBRARY # ps-local finds the build's libpsclient for the Python workers

# A worker that says who it is and what it was given, and exits as told.
cat >"$tmp/task.py" <<'EOF'
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
print(f"task {task['type']}:{task['index']} argv {sys.argv[1:]}", file=sys.stderr, flush=True)
if "--fail" in sys.argv:
    if task["index"] == 1:
        sys.exit(3)
    time.sleep(60)
EOF
chmod a-x "$tmp/task.py"

# check.py LOG: every line JSON; prints "ROLE TASK MSG" lines and the summary's fields.
cat >"$tmp/check.py" <<'EOF'
import json, sys
for n, line in enumerate(open(sys.argv[1]), 1):
    try:
        o = json.loads(line)
    except ValueError:
        sys.exit(f"line {n} is not JSON: {line!r}")
    if o.get("summary"):
        print(f"summary workers_finished={o['workers_finished']} samples_per_s={o['samples_per_s']}")
    else:
        print(o["role"], o["task"], o["msg"])
EOF

run() { # run NAME ARGS...: ps-local ARGS > NAME.out 2> NAME.log; echoes its exit code
    local name=$1
    shift
    "$PS_LOCAL" --timeout 150 "$@" >"$tmp/$name.out" 2>"$tmp/$name.log" &
    local l=$!
    pids+=("$l")
    wait_for "$l" 160
}

# 1. Labels, arguments, counting by exit status.
run ok --workers 2 --worker "$tmp/task.py" -- --flag x
rc=$?
[ "$rc" -eq 0 ] || fail "ps-local with two Python workers exited $rc, expected 0"
"$PY" "$tmp/check.py" "$tmp/ok.log" >"$tmp/ok.lines" || fail "$(cat "$tmp/ok.lines")"
for i in 0 1; do
    grep -qxF "worker $i task worker:$i argv ['--flag', 'x']" "$tmp/ok.lines" ||
        fail "no line of worker $i labelled as worker $i with only the worker arguments: $(cat "$tmp/ok.lines")"
done
grep -q -- "--progress" "$tmp/ok.lines" && fail "a Python worker was given --progress"
grep -qx "summary workers_finished=2 .*" "$tmp/ok.lines" ||
    fail "summary does not count the 2 workers that exited 0: $(grep summary "$tmp/ok.lines")"
echo "labels, arguments and the finished count: ok"

if command -v script >/dev/null 2>&1; then
    # On a terminal: text lines "worker N: ...".
    script -qec "$(printf '%q ' "$PS_LOCAL" --timeout 60 --workers 2 --worker "$tmp/task.py")" \
        /dev/null >"$tmp/tty.log" 2>&1 </dev/null
    for i in 0 1; do
        grep -q "^worker $i: task worker:$i argv \[\]" "$tmp/tty.log" ||
            fail "on a terminal, no line labelled 'worker $i: ': $(cat "$tmp/tty.log")"
    done
    grep -q "summary: 2 worker(s) finished" "$tmp/tty.log" || fail "terminal summary: $(cat "$tmp/tty.log")"
    echo "terminal labels: ok"
else
    echo "terminal labels: not checked (no script(1))"
fi

# 2. A failing worker; bad paths.
run fail --workers 2 --grace-ms 2000 --worker "$tmp/task.py" -- --fail
rc=$?
[ "$rc" -eq 3 ] || fail "ps-local with a worker exiting 3 exited $rc, expected 3"
"$PY" "$tmp/check.py" "$tmp/fail.log" >"$tmp/fail.lines" || fail "$(cat "$tmp/fail.lines")"
grep -qx "summary workers_finished=0 .*" "$tmp/fail.lines" ||
    fail "summary of a failed run: $(grep summary "$tmp/fail.lines")"
run nopy --python /nonexistent/python3 --worker "$tmp/task.py"
rc=$?
[ "$rc" -eq 2 ] && grep -q "python '/nonexistent/python3': not an executable" "$tmp/nopy.log" ||
    fail "a missing interpreter: exit $rc, $(cat "$tmp/nopy.log")"
run noscript --worker "$tmp/none.py"
rc=$?
[ "$rc" -eq 2 ] && grep -q "none.py: No such file" "$tmp/noscript.log" ||
    fail "a missing script: exit $rc, $(cat "$tmp/noscript.log")"
grep -q "started" "$tmp/nopy.log" "$tmp/noscript.log" && fail "something started after a bad path"
echo "failures: ok"

# 3. The examples as workers, in one command each.
example() { # example SCRIPT EPOCHS
    local name=${1%.py}
    run "$name" --workers 2 --worker "$EXAMPLES/$1" -- --epochs "$2" --data-dir "$DATA_DIR" \
        --prefix "lp_$name" --log-every 50
    rc=$?
    [ "$rc" -eq 0 ] || fail "$name: ps-local exited $rc"
    [ "$(grep -c 'test_accuracy=' "$tmp/$name.out")" -eq 1 ] ||
        fail "$name: expected one test_accuracy= line on stdout (worker 0's): $(cat "$tmp/$name.out")"
    local acc
    acc=$(accuracy_of "$tmp/$name.out")
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || fail "$name: test accuracy $acc < 0.75"
    "$PY" "$tmp/check.py" "$tmp/$name.log" >"$tmp/$name.lines" || fail "$(cat "$tmp/$name.lines")"
    for i in 0 1; do
        grep -q "^worker $i training .* on shard $i of 2: 30000 examples" "$tmp/$name.lines" ||
            fail "$name: worker $i did not train on its half: $(cat "$tmp/$name.lines")"
        grep -q "^worker $i trained $((30000 / 128 * $2)) steps in .* samples/s" "$tmp/$name.lines" ||
            fail "$name: worker $i's result line: $(grep trained "$tmp/$name.lines")"
    done
    grep -q "resuming" "$tmp/$name.lines" && fail "$name: a first run says it resumes"
    local summary
    summary=$(grep '^summary' "$tmp/$name.lines")
    [[ "$summary" =~ ^summary\ workers_finished=2\ samples_per_s=([0-9.]+)$ ]] &&
        awk -v s="${BASH_REMATCH[1]}" 'BEGIN { exit !(s > 0) }' ||
        fail "$name: summary '$summary'"
    echo "$name: 2 workers, test_accuracy=$acc, $summary"
}
example mlp_numpy.py 1
if "$PY" -c 'import torch' 2>/dev/null; then
    example torch_mlp.py 1
else
    echo "torch_mlp.py: not run: $PY has no PyTorch (apt-get install python3-torch)"
fi
echo "PASS"
