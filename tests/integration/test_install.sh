#!/usr/bin/env bash
# Installs the project into a temporary root, builds the client example against the installed
# library through pkg-config, checks that libpsclient exports only ps_* symbols, and runs the
# example against a real ps-server.
set -euo pipefail
build_dir=$1
src_dir=$2
server_bin=$3
sanitize=${4:-none} # the build's b_sanitize: the example must use the same runtime
tmp=$(mktemp -d)
trap 'kill $srv 2>/dev/null || true; rm -rf "$tmp"' EXIT
srv=

DESTDIR="$tmp/root" meson install -C "$build_dir" --no-rebuild --quiet
pcdir=$(dirname "$(find "$tmp/root" -name psclient.pc | head -n 1)")
[ -n "$pcdir" ] || { echo "psclient.pc not installed"; exit 1; }
export PKG_CONFIG_PATH="$pcdir" PKG_CONFIG_SYSROOT_DIR="$tmp/root"
cflags=$(pkg-config --cflags psclient)
libs=$(pkg-config --libs psclient)
san_flags=
[ "$sanitize" = none ] || san_flags="-fsanitize=$sanitize"
cc -std=c11 -Wall -Werror $san_flags "$src_dir/client/examples/example.c" $cflags $libs -o "$tmp/example"

lib=$(find "$tmp/root" -name 'libpsclient.so.*' -type f | head -n 1)
leaked=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^ps_' | grep -v '^PSCLIENT_0$' || true)
if [ -n "$leaked" ]; then
  echo "libpsclient exports symbols outside ps_*:"; echo "$leaked" | head; exit 1
fi
nexp=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -c '^ps_')
echo "libpsclient exports $nexp ps_* symbols and nothing else"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cluster="{\"ps\":[\"127.0.0.1:$port\"]}"
TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"ps\",\"index\":0}}" "$server_bin" --log-level warn &
srv=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
LD_LIBRARY_PATH=$(dirname "$lib") TF_CONFIG="{\"cluster\":$cluster}" timeout 30 "$tmp/example"
kill -TERM $srv
wait $srv
echo "example built from the installed library ran OK; server exited 0"
