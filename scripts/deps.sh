#!/usr/bin/env bash
# Installs the Debian packages hetmoe builds and tests with. Safe to run again.
set -euo pipefail
# Only what the code uses today (oneDNN: the comparison benchmark tests/bench/bench_onednn). clang builds the fuzz targets; clang-format and clang-tidy check the style.
packages=(
  build-essential cmake ninja-build ccache git clang clang-format clang-tidy libclang-rt-14-dev
  libfmt-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev libgtest-dev libpcre2-dev libreadline-dev libbenchmark-dev
  libhwloc-dev libnuma-dev libdnnl-dev
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

# The server's client tests drive it with the official `openai` npm package: Node from Debian (when no node is
# installed yet) and the package pinned in tests/client/package-lock.json, installed there. Test-only.
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
client="$(dirname "$0")/../tests/client"
if [[ ! -d $client/node_modules/openai ]]; then
  npm ci --prefix "$client" --no-audit --no-fund --loglevel=error
fi
