# shellcheck shell=bash
# What the command-line tests that run a real etcd share (tests/integration/test_replicas_cli.sh,
# test_slots_cli.sh, test_slot_moves.sh, test_slot_add.sh): source it; the test sets $fail=0
# first and reads $fail at the end.
#
#   check NAME WANT-EXIT TEXT CMD...   tests/support/check.sh's
#   port                               a loopback TCP port that was free a moment ago
#   etcd_or_skip                       $etcd: $PSD_ETCD or /usr/bin/etcd; when it is missing,
#                                      exits 77 (the rest skipped) or 1 if a check failed
#   etcd_tmp NAME                      $tmp: a directory of its own (/tmp/psd-NAME-XXXXXX) and
#                                      $shm one on tmpfs when there is one (etcd's fsyncs on a
#                                      busy disk stall it for seconds), both removed on exit,
#                                      after every pid in $pids is killed
#   etcd_start [DATA]                  an etcd on free ports with its data in $shm/DATA (etcd),
#                                      its log $tmp/DATA.log; $etcd_pid, its URL in $coord;
#                                      returns once it answers a read (it listens before it
#                                      has a leader)
#   wait_log FILE TEXT SECONDS         0 once FILE has a line with TEXT, 1 after SECONDS
#   etcd_put KEY VALUE, etcd_del KEY   through etcd's v3 HTTP gateway at $coord

# shellcheck source=check.sh
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"

port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

etcd_or_skip() {
    etcd=${PSD_ETCD:-/usr/bin/etcd}
    if [ ! -x "$etcd" ]; then
        echo "SKIP the rest: no etcd at $etcd (install Debian's etcd-server)"
        [ "$fail" -eq 0 ] && exit 77
        exit "$fail"
    fi
}

pids=()
etcd_cleanup() {
    local p
    # Only this shell's running jobs: a reaped child's number may be another process's now.
    for p in $(jobs -rp); do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp" "${shm:-$tmp}"
}

etcd_tmp() {
    tmp=$(mktemp -d "/tmp/psd-$1-XXXXXX")
    shm=$tmp
    [ -w /dev/shm ] && shm=$(mktemp -d "/dev/shm/psd-$1-XXXXXX")
    trap etcd_cleanup EXIT
}

etcd_start() {
    local data=${1:-etcd} cp pp
    cp=$(port)
    pp=$(port)
    "$etcd" --data-dir "$shm/$data" --listen-client-urls "http://127.0.0.1:$cp" \
        --advertise-client-urls "http://127.0.0.1:$cp" --listen-peer-urls "http://127.0.0.1:$pp" \
        --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
        --initial-cluster "default=http://127.0.0.1:$pp" >"$tmp/$data.log" 2>&1 &
    etcd_pid=$!
    pids+=("$etcd_pid")
    coord="http://127.0.0.1:$cp"
    for _ in $(seq 100); do
        /usr/bin/python3 -c 'import urllib.request,sys; urllib.request.urlopen(sys.argv[1], b"{\"key\":\"AA==\"}", timeout=1)' \
            "$coord/v3/kv/range" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

wait_log() {
    for _ in $(seq $(($3 * 10))); do
        grep -q -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

etcd_put() {
    /usr/bin/python3 -c 'import urllib.request,sys,base64,json; b=lambda s: base64.b64encode(s.encode()).decode(); urllib.request.urlopen(sys.argv[1]+"/v3/kv/put", json.dumps({"key":b(sys.argv[2]),"value":b(sys.argv[3])}).encode(), timeout=3)' \
        "$coord" "$1" "$2"
}

etcd_del() {
    /usr/bin/python3 -c 'import urllib.request,sys,base64,json; urllib.request.urlopen(sys.argv[1]+"/v3/kv/deleterange", json.dumps({"key":base64.b64encode(sys.argv[2].encode()).decode()}).encode(), timeout=3)' \
        "$coord" "$1"
}

# The usual start of a test: skip without etcd, a temporary directory, etcd up (or fail).
etcd_setup() {
    etcd_or_skip
    etcd_tmp "$1"
    etcd_start || { echo "FAIL etcd did not answer: $(tail -n 5 "$tmp/etcd.log")"; exit 1; }
}
