#!/usr/bin/env bash
# README.md's C example (the ```c block of the "Client API" section) compiled exactly as printed
# against the built libpsclient and run against a real ps-server with TF_CONFIG set: it must
# be a complete program and exit 0.
set -euo pipefail
readme=$1
client_src=$2 # directory of psclient.h
lib=$3        # the built libpsclient.so
server_bin=$4
sanitize=${5:-none} # the build's b_sanitize: the program must use the same runtime
tmp=$(mktemp -d)
srv=
trap '[ -z "$srv" ] || kill $srv 2>/dev/null || true; rm -rf "$tmp"' EXIT

awk '/^## Client API/ { sec = 1; next }
     sec && /^## / { exit }
     sec && !inblk && /^```c$/ { inblk = 1; n++; next }
     inblk && /^```$/ { inblk = 0; if (n == 1) exit; next }
     inblk && n == 1 { print }' "$readme" >"$tmp/readme_example.c"
[ -s "$tmp/readme_example.c" ] || { echo "no \`\`\`c block in README.md's Client API section"; exit 1; }
grep -q 'int main' "$tmp/readme_example.c" || { echo "README's example has no main"; exit 1; }

san_flags=
[ "$sanitize" = none ] || san_flags="-fsanitize=$sanitize"
libdir=$(dirname "$lib")
# shellcheck disable=SC2086 # $san_flags is empty or one word
cc -std=c11 -Wall -Wextra -Werror $san_flags -I"$client_src" "$tmp/readme_example.c" \
  -L"$libdir" -lpsclient -o "$tmp/readme_example"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
wport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# The example calls ps_clock, as a worker does: it runs as worker task 0.
cluster="{\"ps\":[\"127.0.0.1:$port\"],\"worker\":[\"127.0.0.1:$wport\"]}"
TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"ps\",\"index\":0}}" "$server_bin" --log-level warn &
srv=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.05; done
rc=0
LD_LIBRARY_PATH=$libdir TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":0}}" \
  timeout 60 "$tmp/readme_example" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "README's example exited $rc"; exit 1
fi
kill -TERM $srv
wait $srv
srv=
echo "README's C example compiled as printed and ran OK"
