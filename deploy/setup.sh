#!/usr/bin/env bash
# Installs what building, testing and running the project needs, from Debian's packages.
# Run it as yourself or as root on Debian 12: it does nothing when everything is there already,
# and otherwise installs the missing packages with apt-get, as root directly, else through sudo
# (which asks for your password), else it says exactly what to run as root.
set -euo pipefail

packages=(
  build-essential meson ninja-build pkg-config cmake
  libnng-dev libmbedtls-dev libprotobuf-c-dev protobuf-c-compiler
  libjson-c-dev libjemalloc-dev libcmocka-dev libopenblas-dev zlib1g-dev
  dataset-fashion-mnist
  iproute2 iptables openssl
  python3-numpy python3-pytest python3-venv
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
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

# nng: Debian 12's nng 1.5.2 has defects the service cannot live with; the build then links
# Debian's nng source with our fixes (deploy/nng/), fetched and patched here (a no-op once done).
"$(dirname "$0")/nng/fetch.sh"
