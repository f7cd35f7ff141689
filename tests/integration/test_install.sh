#!/usr/bin/env bash
# Installs the project into a staging directory (meson install --destdir), builds the client
# example against the staged library through pkg-config (PKG_CONFIG_SYSROOT_DIR: psclient.pc
# must hold no absolute path but its prefix), checks that libpsclient exports only ps_*
# symbols, and runs the example against a real ps-server with LD_LIBRARY_PATH into the stage.
set -euo pipefail
build_dir=$1
src_dir=$2
server_bin=$3
sanitize=${4:-none} # the build's b_sanitize: the example must use the same runtime
tmp=$(mktemp -d)
trap 'kill $srv 2>/dev/null || true; rm -rf "$tmp"' EXIT
srv=

stage="$tmp/root"
meson install -C "$build_dir" --no-rebuild --quiet --destdir "$stage"
# The staged psclient.pc sits at STAGE/<prefix>/<libdir>/pkgconfig (libdir may be absolute).
read -r prefix libdir < <(meson introspect "$build_dir" --buildoptions | python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
print(o["prefix"], o["libdir"])')
case $libdir in /*) ;; *) libdir=$prefix/$libdir ;; esac
pcdir=$stage$libdir/pkgconfig
pc=$pcdir/psclient.pc
[ -f "$pc" ] || { echo "psclient.pc not installed at $pc"; find "$stage" -name '*.pc'; exit 1; }
# No placeholder URL, and no absolute path but the prefix: everything else is relative to
# ${prefix}/${libdir}/${includedir}, so that a staged or relocated install works.
if grep -qi 'example\.invalid' "$pc"; then echo "psclient.pc has a placeholder URL:"; cat "$pc"; exit 1; fi
abs=$(grep -v '^prefix=' "$pc" | grep -E '(^|[[:space:]=:])/' || true)
if [ -n "$abs" ]; then echo "psclient.pc has absolute paths:"; echo "$abs"; exit 1; fi

export PKG_CONFIG_SYSROOT_DIR="$stage" PKG_CONFIG_PATH="$pcdir"
flags=$(pkg-config --cflags --libs psclient)
echo "pkg-config --cflags --libs psclient: $flags"
case " $flags " in
*" -L$stage$libdir "*) ;;
*) echo "pkg-config --libs does not point into the stage ($stage$libdir)"; exit 1 ;;
esac
san_flags=
[ "$sanitize" = none ] || san_flags="-fsanitize=$sanitize"
# shellcheck disable=SC2086 # $flags is a list of words
cc -std=c11 -Wall -Werror $san_flags "$src_dir/client/examples/example.c" $flags -o "$tmp/example"

lib=$(find "$stage$libdir" -maxdepth 1 -name 'libpsclient.so.*' -type f | head -n 1)
[ -n "$lib" ] || { echo "libpsclient.so not installed in $stage$libdir"; exit 1; }
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
