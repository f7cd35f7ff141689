#!/usr/bin/env bash
# psctl against a real ps-server: status, vars, dump (raw and .npy), top, checkpoint without a
# checkpoint-dir (exit 1 naming FAILED_PRECONDITION), usage errors (exit 2), shutdown; status
# of a server whose checkpoints fail (its directory replaced by a file) names the error.
# Arguments: ps-server, psctl, psctl_push (the helper that creates and pushes a variable).
set -u
server=$1 psctl=$2 push=$3
fail=0
dir=$(mktemp -d /tmp/psd-psctl-XXXXXX)
spid=
cleanup() { [ -n "$spid" ] && kill -9 "$spid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export TF_CONFIG="{\"cluster\":{\"ps\":[\"127.0.0.1:$port\"]}}"
"$server" --cluster "{\"ps\":[\"127.0.0.1:$port\"]}" --task ps:0 2>"$dir/server.log" &
spid=$!
for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done

# Usage and configuration errors: exit 2 before any call to the cluster.
out=$("$psctl" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "no command" <<<"$out" && ok "no command" || bad "no command: $rc $out"
out=$("$psctl" frobnicate 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "unknown command" <<<"$out" && ok "unknown command" || bad "unknown command: $rc $out"
out=$("$psctl" dump onlyone 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "VAR FILE" <<<"$out" && ok "dump usage" || bad "dump usage: $rc $out"
out=$(env -u TF_CONFIG "$psctl" status 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "no cluster spec" <<<"$out" && ok "no cluster" || bad "no cluster: $rc $out"
out=$("$psctl" --version 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "^psctl " <<<"$out" && ok "--version" || bad "--version: $rc $out"

"$push" psctl_w || bad "helper push"

out=$("$psctl" status --json); rc=$?
if [ $rc -eq 0 ] && python3 -c '
import json, sys
d = json.loads(sys.argv[1])
s = d["servers"][0]
assert len(d["servers"]) == 1, d
assert s["variables"] == 1, s
assert s["updates_applied"] == 2, s
assert s["requests"] >= 3 and s["bytes_held"] >= 24, s
for k in ("task", "uptime_ms", "errors", "min_clock", "live_workers", "evictions"):
    assert k in s, k
assert "staleness_max" in d and "slowest_worker" in d, d
' "$out"; then ok "status --json"; else bad "status --json: $rc $out"; fi
out=$("$psctl" status); rc=$?
[ $rc -eq 0 ] && grep -q "updates" <<<"$out" && ok "status table" || bad "status table: $rc $out"
grep -q "ps 0 checkpoints: off (no checkpoint-dir)" <<<"$out" && ok "status: checkpoints off" \
  || bad "status without checkpoint-dir: $out"

out=$("$psctl" vars); rc=$?
[ $rc -eq 0 ] && grep -qx "psctl_w" <<<"$out" && ok "vars" || bad "vars: $rc $out"
out=$("$psctl" --json vars psctl_w); rc=$?
if [ $rc -eq 0 ] && python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert d == {"name": "psctl_w", "shape": [2, 3], "numel": 6, "shards": 1, "staleness_bound": -1}, d
' "$out"; then ok "vars NAME --json"; else bad "vars NAME --json: $rc $out"; fi
out=$("$psctl" vars no_such_var 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "NOT_FOUND" <<<"$out" && grep -q no_such_var <<<"$out" && ok "vars missing" || bad "vars missing: $rc $out"

"$psctl" dump psctl_w "$dir/w.bin" >/dev/null && python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read()
v = struct.unpack("<6f", b)
assert v == (-1.0, -2.0, -3.0, -4.0, -5.0, -6.0), v
' "$dir/w.bin" && ok "dump raw" || bad "dump raw"
"$psctl" dump psctl_w "$dir/w.npy" >/dev/null && python3 -c '
import ast, struct, sys
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"\x93NUMPY\x01\x00", b[:8]
hl = struct.unpack("<H", b[8:10])[0]
assert (10 + hl) % 64 == 0 and b[10 + hl - 1:10 + hl] == b"\n"
h = ast.literal_eval(b[10:10 + hl].decode("latin1").strip())
assert h == {"descr": "<f4", "fortran_order": False, "shape": (2, 3)}, h
v = struct.unpack("<6f", b[10 + hl:])
assert v == (-1.0, -2.0, -3.0, -4.0, -5.0, -6.0), v
' "$dir/w.npy" && ok "dump npy" || bad "dump npy"
if python3 -c 'import numpy' 2>/dev/null; then
  python3 -c 'import numpy, sys; a = numpy.load(sys.argv[1]); assert a.shape == (2, 3) and a[1, 2] == -6, a' "$dir/w.npy" \
    && ok "numpy.load" || bad "numpy.load"
fi

out=$("$psctl" top --iterations 2 --json </dev/null); rc=$?
if [ $rc -eq 0 ] && python3 -c '
import json, sys
lines = sys.argv[1].splitlines()
assert len(lines) == 2, lines
for l in lines:
    d = json.loads(l)
    s = d["servers"][0]
    for k in ("requests_per_s", "bytes_per_s", "updates_per_s", "live_workers", "min_clock"):
        assert k in s, k
    assert s["requests_per_s"] > 0, s  # psctl asks for the status itself each refresh
' "$out"; then ok "top --iterations 2 --json"; else bad "top: $rc $out"; fi

out=$("$psctl" checkpoint 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "FAILED_PRECONDITION" <<<"$out" && grep -q checkpoint <<<"$out" \
  && ok "checkpoint without checkpoint-dir" || bad "checkpoint: $rc $out"

out=$("$psctl" shutdown 2>&1); rc=$?
[ $rc -eq 0 ] && ok "shutdown" || bad "shutdown: $rc $out"
for _ in $(seq 100); do kill -0 "$spid" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$spid" 2>/dev/null; then
  bad "server still running after psctl shutdown"
else
  wait "$spid"; src=$?
  [ $src -eq 0 ] && ok "server exited 0" || bad "server exit $src"; spid=
fi
# A stopped cluster is a runtime failure (exit 1), named.
out=$("$psctl" --deadline-ms 300 status 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "status of ps 0" <<<"$out" && ok "status of a stopped cluster" || bad "stopped cluster: $rc $out"

# Checkpoints that fail: psctl checkpoint exits 1 with the cause, status shows them failing.
mkdir "$dir/ck"
"$server" --cluster "{\"ps\":[\"127.0.0.1:$port\"]}" --task ps:0 --checkpoint-dir "$dir/ck" \
  2>>"$dir/server.log" &
spid=$!
for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
mv "$dir/ck" "$dir/ck.moved" && : >"$dir/ck"
out=$("$psctl" checkpoint 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "Not a directory" <<<"$out" && ok "checkpoint that fails" \
  || bad "checkpoint into a file: $rc $out"
out=$("$psctl" status 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "ps 0 checkpoints: FAILING, 1 in a row .*last error: .*Not a directory" \
  <<<"$out" && ok "status: checkpoints failing" || bad "status of failing checkpoints: $rc $out"
out=$("$psctl" status --json); rc=$?
if [ $rc -eq 0 ] && python3 -c '
import json, sys
k = json.loads(sys.argv[1])["servers"][0]["checkpoint"]
assert k["failures"] == 1 and k["failures_in_row"] == 1, k
assert "Not a directory" in k["last_error"], k
' "$out"; then ok "status --json: checkpoint"; else bad "status --json checkpoint: $rc $out"; fi
kill -9 "$spid"; wait "$spid" 2>/dev/null; spid=
[ $fail -ne 0 ] && cat "$dir/server.log"
exit $fail
