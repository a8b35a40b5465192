#!/usr/bin/env bash
# Installs kvgraph's build and test dependencies from Debian/Ubuntu packages.
# Idempotent; needs root (or sudo).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PKGS=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev
      libpcre2-dev libgtest-dev libgmock-dev librapidcheck-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install-deps] installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "[install-deps] ok"
