#!/usr/bin/env bash
# Installs what building, testing and running the project needs, from Debian's packages.
#
#   deploy/setup.sh          what the build, the tests and the programs need
#   deploy/setup.sh --test   that, and what only some tests use (tests/run.sh passes it): podman,
#                            runc, debootstrap, curl and podman-compose (the container image and
#                            compose tests, with netavark and aardvark-dns for the compose
#                            network's service names), python3-torch (the PyTorch glue),
#                            etcd-server (the coordinator of replicated servers) and
#                            libzmq3-dev (ps-kv-compare's baseline server); and a venv
#                            with the tensorboard package from PyPI (the test of the event
#                            files reads them with TensorBoard's own reader) in
#                            /opt/psd-tb-venv, or PSD_TB_VENV
#   deploy/setup.sh --etcd   also etcd-server, for replicated servers (replicas > 1) on this
#                            machine: `ps-local --replicas N` starts it itself
#
# Run it as yourself or as root on Debian 12: it does nothing when everything is there already,
# and otherwise installs the missing packages with apt-get, as root directly, else through sudo
# (which asks for your password), else it says exactly what to run as root. Exit code 2: an
# unknown argument.
set -euo pipefail

with_tests=no
with_etcd=no
for arg in "$@"; do
  case "$arg" in
  --test) with_tests=yes ;;
  --etcd) with_etcd=yes ;;
  -h | --help)
    sed -n '2,/^set /{/^set /d;p}' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "setup: unknown argument '$arg' (usage: deploy/setup.sh [--test] [--etcd])" >&2
    exit 2
    ;;
  esac
done

packages=(
  build-essential meson ninja-build pkg-config cmake
  libnng-dev libmbedtls-dev libssl-dev libprotobuf-c-dev protobuf-c-compiler
  libjson-c-dev libjemalloc-dev libcmocka-dev libopenblas-dev zlib1g-dev librocksdb-dev
  dataset-fashion-mnist
  iproute2 iptables openssl
  python3-numpy python3-pytest python3-venv python3-dev
)
if [ "$with_tests" = yes ]; then
  packages+=(
    podman runc debootstrap curl podman-compose netavark aardvark-dns
    python3-torch
    etcd-server
    libzmq3-dev
  )
elif [ "$with_etcd" = yes ]; then
  packages+=(etcd-server)
fi

# --test: TensorBoard (from PyPI, the only download here besides Debian's packages) in a venv
# of its own, for tests/integration/test_events.sh; made once, as root directly or through sudo.
tb_venv() {
  local venv=${PSD_TB_VENV:-/opt/psd-tb-venv} run=()
  [ "$with_tests" = yes ] || return 0
  "$venv/bin/python" -c "import tensorboard" 2>/dev/null && return 0
  if [ ! -w "$(dirname "$venv")" ] && [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      run=(sudo)
    else
      echo "setup: cannot write $venv; run as root: python3 -m venv $venv &&" \
        "$venv/bin/pip install tensorboard (or set PSD_TB_VENV)" >&2
      return 1
    fi
  fi
  echo "setup: making $venv with the tensorboard package from PyPI" >&2
  "${run[@]}" python3 -m venv "$venv" && "${run[@]}" "$venv/bin/pip" install -q tensorboard
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  tb_venv
  exec "$(dirname "$0")/nng/fetch.sh" # the nng block at the end
fi

echo "setup: installing ${missing[*]}" >&2
if [ "$(id -u)" -eq 0 ]; then
  as_root=(env)
elif command -v sudo >/dev/null 2>&1; then
  echo "setup: installing packages needs root: asking sudo" >&2
  as_root=(sudo)
else
  echo "setup: installing packages needs root, and sudo is not installed; run as root:" >&2
  echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
  echo "setup: then run this command again" >&2
  exit 1
fi
"${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get update -q
"${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  "${missing[@]}"
tb_venv

# nng: Debian 12's nng 1.5.2 has defects the service cannot live with; the build then links
# Debian's nng source with our fixes (deploy/nng/), fetched and patched here (a no-op once done).
"$(dirname "$0")/nng/fetch.sh"
