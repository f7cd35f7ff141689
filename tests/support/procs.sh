# shellcheck shell=bash
# Processes started by a test or bench script, and the helpers to wait for them and read their
# logs (source this file; for tests/integration/test_train.sh, tests/integration/test_netns.sh
# and bench/netns_bench.sh). The script sets $tmp (a directory of its own) and appends every
# background pid it starts to $pids.
#
#   procs_on_exit [HOOK]     on exit: SIGKILL every pid in $pids, run HOOK (e.g. netns_destroy),
#                            reap the children and remove $tmp (kept, and named on stderr,
#                            when PS_TEST_KEEP_TMP=1); SIGINT/SIGTERM exit 130
#   fail MSG                 prints FAIL: MSG and the last 20 lines of every $tmp/*.log (400 of
#                            a stacks-PID.log), exit 1
#   procs_running PID        whether PID is a live child of this shell (never signal another)
#   wait_for PID SECONDS     waits for PID: its exit code, or 124 on timeout (PID killed; with
#                            gdb installed, its threads' stacks go to $tmp/stacks-PID.log)
#   wait_log FILE PATTERN SECONDS   waits until FILE has a line matching PATTERN (grep): 0, or 1
#   accuracy_of FILE         the test_accuracy= value of the last line of FILE that has one
#   field_of FILE NAME       the numeric value of NAME= on that (worker 0's final) line

pids=()
procs_hook=

# Whether PID is a live child of this shell. A child this shell has reaped may have its number
# given to any other process on the machine (pid_max is 32768 on many hosts, and a test suite
# goes through that many processes in minutes): signalling such a number could stop another
# test's process, so cleanups and waits signal and wait only for live children.
procs_running() {
    local stat ppid
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    ppid=${stat##*) }
    ppid=${ppid#* }
    ppid=${ppid%% *}
    [ "$ppid" = "$$" ] || [ "$ppid" = "${BASHPID:-$$}" ]
}

procs_cleanup() {
    local p
    for p in "${pids[@]}"; do
        procs_running "$p" && kill -KILL "$p" 2>/dev/null
    done
    [ -z "$procs_hook" ] || "$procs_hook"
    wait 2>/dev/null
    if [ "${PS_TEST_KEEP_TMP:-0}" = 1 ]; then
        echo "kept $tmp (PS_TEST_KEEP_TMP=1)" >&2
    else
        rm -rf "$tmp"
    fi
}

procs_on_exit() {
    procs_hook=${1:-}
    trap procs_cleanup EXIT
    trap 'exit 130' INT TERM
}

fail() {
    echo "FAIL: $*" >&2
    for f in "$tmp"/*.log; do
        [ -f "$f" ] || continue
        local n=20
        case "$f" in */stacks-*) n=400 ;; esac
        echo "---- $f (last $n lines)" >&2
        tail -n "$n" "$f" >&2
    done
    exit 1
}

wait_for() {
    local pid=$1 limit=$2 i=0
    while procs_running "$pid"; do
        if [ "$i" -ge $((limit * 10)) ]; then
            # Where it hangs, for the failure's log (fail prints $tmp/*.log).
            if command -v gdb >/dev/null 2>&1 && [ -n "${tmp:-}" ] && [ -d "$tmp" ]; then
                timeout 30 gdb -p "$pid" -batch -ex "thread apply all bt" \
                    >"$tmp/stacks-$pid.log" 2>&1
            fi
            kill -KILL "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            return 124
        fi
        sleep 0.1
        i=$((i + 1))
    done
    wait "$pid"
}

wait_log() {
    local _
    for _ in $(seq $(($3 * 10))); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

accuracy_of() {
    sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p' "$1" | tail -n 1
}

field_of() {
    sed -n "s/.*test_accuracy=.* $2=\([0-9.]*\).*/\1/p" "$1" | tail -n 1
}
