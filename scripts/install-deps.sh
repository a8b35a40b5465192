#!/usr/bin/env bash
# Installs kvgraph's build and test dependencies from Debian/Ubuntu packages.
# Idempotent; needs root (or sudo).
#
#   scripts/install-deps.sh          what the cpu, asan and cuda presets need (g++)
#   scripts/install-deps.sh --fuzz   also clang and its libFuzzer runtime, for the fuzz preset
#                                    (Debian 12: clang 14, libclang_rt.fuzzer from libclang-rt-14-dev)
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
# python3-jinja2: the chat-template tests compare kvgraph's Jinja renderer with Python's jinja2.
PKGS=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev
      libpcre2-dev libgtest-dev libgmock-dev librapidcheck-dev python3 python3-jinja2
      libcpp-httplib-dev)
for arg in "$@"; do
  case "$arg" in
    --fuzz) PKGS+=(clang libclang-rt-dev) ;;
    *) echo "kvgraph: error: [install-deps] unknown option \"$arg\" (usage: install-deps.sh [--fuzz])" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the server's client test (tests/server/client: the
# `openai` package against `kvgraph serve`). Checked as commands, not
# packages: a Node.js from elsewhere (nodesource bundles npm) is as good.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install-deps] installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "[install-deps] ok"
