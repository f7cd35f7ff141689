#!/usr/bin/env bash
# ps-local's socket directory (ps-local.PID.XXXXXX under $TMPDIR) is never left behind:
#
#   test_local_tmpdir.sh PS_SERVER PS_LOCAL
#
# 1. SIGTERM, SIGINT and SIGHUP to a running ps-local (2 ps-servers listening on ipc://, a
#    worker that sleeps): exit 128+N and no directory or socket left.
# 2. SIGKILL leaves its directory (nothing runs to remove it); the next ps-local that starts
#    removes it and says so, and leaves alone: the directory of a ps-local that still runs
#    (its servers keep serving), one whose pid is dead but whose socket has a listener, one
#    without a pid in its name, and one that holds another file. When that one stops, its own
#    directory goes too.
# The workers are a shell script (no training): only the launcher's lifecycle is tested.
set -u
PS_SERVER=${1:?ps-server}
PS_LOCAL=${2:?ps-local}
# shellcheck source=../support/procs.sh
. "$(cd "$(dirname "$0")" && pwd)/../support/procs.sh"

tmp=$(mktemp -d /tmp/ps-test-localtmp-XXXXXX)
procs_on_exit
export TMPDIR="$tmp/t"
mkdir -p "$TMPDIR"
printf '#!/bin/sh\nexec sleep 60\n' >"$tmp/sleeper"
printf '#!/bin/sh\nexit 0\n' >"$tmp/quick"
chmod +x "$tmp/sleeper" "$tmp/quick"

# start_local LOG WORKER: ps-local with 2 ps-servers on ipc:// and 1 worker; sets $l.
start_local() {
    "$PS_LOCAL" --ps 2 --workers 1 --transport ipc --grace-ms 3000 --server "$PS_SERVER" --worker "$2" \
        >"$tmp/$1.out" 2>"$tmp/$1.log" &
    l=$!
    pids+=("$l")
}
# The socket directory of ps-local pid $1, once both its servers listen (up to 10 s).
dir_of() {
    local d
    for _ in $(seq 100); do
        d=$(compgen -G "$TMPDIR/ps-local.$1.*")
        if [ -n "$d" ] && [ -S "$d/ps-0.sock" ] && [ -S "$d/ps-1.sock" ]; then
            echo "$d"
            return 0
        fi
        sleep 0.1
    done
    return 1
}
live_socket() {
    /usr/bin/python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX)
sys.exit(s.connect_ex(sys.argv[1]))' "$1"
}

# 1. The signals that stop ps-local remove its directory.
for sig in TERM INT HUP; do
    start_local "$sig" "$tmp/sleeper"
    d=$(dir_of "$l") || fail "$sig: no socket directory with both servers' sockets"
    kill -"$sig" "$l"
    wait_for "$l" 15
    rc=$?
    want=$((128 + $(kill -l "$sig")))
    [ "$rc" -eq "$want" ] || fail "SIG$sig: ps-local exited $rc, expected $want"
    [ ! -e "$d" ] || fail "SIG$sig: $d left behind: $(ls "$d")"
    echo "SIG$sig: exit $rc, $d removed"
done
left=$(compgen -G "$TMPDIR/ps-local.*")
[ -z "$left" ] || fail "left after the signals: $left"

# 2. SIGKILL: the directory stays, stale; the next start removes it and nothing else.
start_local running "$tmp/sleeper"
running=$l
running_dir=$(dir_of "$l") || fail "no socket directory of the running ps-local"
start_local killed "$tmp/sleeper"
killed_pid=$l
killed_dir=$(dir_of "$l") || fail "SIGKILL: no socket directory"
kill -KILL "$l"
wait "$l" 2>/dev/null
# Its servers die with it (PR_SET_PDEATHSIG): wait until no socket answers.
for _ in $(seq 50); do
    live_socket "$killed_dir/ps-0.sock" || live_socket "$killed_dir/ps-1.sock" || break
    sleep 0.1
done
[ -S "$killed_dir/ps-0.sock" ] || fail "SIGKILL: $killed_dir/ps-0.sock is gone already (the test needs a stale one)"
sh -c 'exit 0' &
dead=$!
wait "$dead"
listened="$TMPDIR/ps-local.$dead.Lstn01"
mkdir "$listened"
/usr/bin/python3 -c 'import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen()
time.sleep(60)' "$listened/ps-0.sock" &
pids+=("$!")
for _ in $(seq 50); do
    [ -S "$listened/ps-0.sock" ] && break
    sleep 0.1
done
legacy="$TMPDIR/ps-local.AbCdEf"
mkdir "$legacy"
other="$TMPDIR/ps-local.$dead.Other1"
mkdir "$other"
touch "$other/notes.txt"

start_local next "$tmp/quick"
wait_for "$l" 30
rc=$?
[ "$rc" -eq 0 ] || fail "the next ps-local exited $rc"
[ ! -e "$killed_dir" ] || fail "the stale $killed_dir of the SIGKILLed ps-local ($killed_pid) was not removed"
grep -q "removed $killed_dir, left by ps-local pid $killed_pid" "$tmp/next.log" ||
    fail "the next ps-local did not say it removed $killed_dir"
[ -S "$running_dir/ps-0.sock" ] && [ -S "$running_dir/ps-1.sock" ] ||
    fail "the running ps-local's sockets were removed"
live_socket "$running_dir/ps-0.sock" || fail "the running ps-local's server 0 no longer answers"
[ -S "$listened/ps-0.sock" ] || fail "a directory with a listening socket was removed"
[ -d "$legacy" ] || fail "a directory without an owner pid was removed"
[ -f "$other/notes.txt" ] || fail "a directory holding another file was emptied"
[ -z "$(compgen -G "$TMPDIR/ps-local.$l.*")" ] || fail "the next ps-local left its own directory"
echo "SIGKILL: $killed_dir left, removed by the next start; the other 4 directories kept"

kill -TERM "$running"
wait_for "$running" 15
rc=$?
[ "$rc" -eq 143 ] || fail "the running ps-local exited $rc after SIGTERM, expected 143"
[ ! -e "$running_dir" ] || fail "$running_dir left after SIGTERM"
echo "PASS"
