#!/usr/bin/env bash
# ps-server's command line: --help, wrong specs (exit 2 with a message naming the problem),
# SIGTERM and SIGINT (clean exit 0), shutdown requested by a client.
set -u
bin=$1
fail=0
# shellcheck source=../support/check.sh
. "$(dirname "$0")/../support/check.sh"
check help 0 "max-message-bytes" "$bin" --help
check no-spec 2 "no cluster spec" env -u TF_CONFIG "$bin"
check bad-json 2 "cluster" env TF_CONFIG='{"cluster":' "$bin"
check bad-address 2 'ps\[1\]' env TF_CONFIG='{"cluster":{"ps":["127.0.0.1:1","127.0.0.1"]},"task":{"type":"ps","index":1}}' "$bin"
check bad-index 2 "out of range" env TF_CONFIG='{"cluster":{"ps":["127.0.0.1:1"]},"task":{"type":"ps","index":3}}' "$bin"
check worker-task 2 "ps-server serves a ps task" env TF_CONFIG='{"cluster":{"ps":["127.0.0.1:1"],"worker":["127.0.0.1:2"]},"task":{"type":"worker","index":0}}' "$bin"
check bad-flag 2 "threads" "$bin" --threads 257 --cluster '{"ps":["127.0.0.1:1"]}' --task ps:0
check unknown-flag 2 "unknown" "$bin" --no-such-flag

for sig in TERM INT; do
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$bin" --cluster "{\"ps\":[\"127.0.0.1:$port\"]}" --task ps:0 --log-format json 2>/tmp/psd-cli-$$.log &
  pid=$!
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
  kill -$sig $pid
  wait $pid; rc=$?
  if [ $rc -ne 0 ] || ! grep -q "received SIG$sig" /tmp/psd-cli-$$.log; then
    echo "FAIL SIG$sig: exit $rc"; cat /tmp/psd-cli-$$.log; fail=1
  else
    echo "ok   SIG$sig exits 0"
  fi
  # JSON lines carry role, task and level.
  python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]; r=json.loads(open(sys.argv[1]).readline()); assert r["role"]=="ps" and r["task"]==0 and r["level"]=="info"' /tmp/psd-cli-$$.log || { echo "FAIL log format"; fail=1; }
  rm -f /tmp/psd-cli-$$.log
done
exit $fail
