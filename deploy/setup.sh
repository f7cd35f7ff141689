#!/usr/bin/env bash
# Installs what building, testing and running the project needs, from Debian's packages.
# Run as root (or through sudo) on Debian 12. Does nothing when everything is there already.
set -euo pipefail

packages=(
  build-essential meson ninja-build pkg-config cmake
  libnng-dev libmbedtls-dev libprotobuf-c-dev protobuf-c-compiler
  libjson-c-dev libjemalloc-dev libcmocka-dev libopenblas-dev zlib1g-dev
  dataset-fashion-mnist
  iproute2 iptables
  python3-numpy python3-pytest python3-venv
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages: ${missing[*]}" >&2
  echo "setup: run as root (sudo $0) to install them" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
