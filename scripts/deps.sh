#!/usr/bin/env bash
# Installs the Debian packages hetmoe builds and tests with. Safe to run again.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache clang libclang-rt-14-dev
  libfmt-dev libhwloc-dev libnuma-dev libdnnl-dev libcli11-dev nlohmann-json3-dev
  libpcre2-dev libreadline-dev libgtest-dev libgmock-dev libbenchmark-dev python3
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
