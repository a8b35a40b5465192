#!/usr/bin/env bash
# ctest server_openai_client: installs the locked `openai` package into the
# build tree (npm ci, once per lock file) and runs client_test.mjs against
# the kvgraph binary. Usage: run.sh PATH/TO/kvgraph WORK_DIR
# Exit 77 (ctest: skipped) when node or npm is missing; scripts/install-deps.sh
# installs them, so CI always runs it.
set -euo pipefail
kvgraph=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "[server_openai_client] node or npm not found: skipped (scripts/install-deps.sh installs them)" >&2
  exit 77
fi
mkdir -p "$work"
if ! cmp -s "$here/package-lock.json" "$work/package-lock.json" || [ ! -d "$work/node_modules/openai" ]; then
  cp "$here/package.json" "$here/package-lock.json" "$work/"
  # A lock that does not match ends with npm's error rather than a silently different client.
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error)
fi
cp "$here/client_test.mjs" "$work/"
cd "$work"
exec node client_test.mjs "$kvgraph"
