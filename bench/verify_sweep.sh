#!/usr/bin/env bash
# The verify step's several-token GEMV variants (issue 16) on one GPU:
# `kvgraph bench --verify-tokens T --tune mt=V` for each (V, T) given, each
# row tagged with its variant in OUT/verify.jsonl, and a table of the
# verify step over one decode step (the target: T = 5 <= 1.25x on
# llama3.1-8b).
#   SPECS="p8u1:5 s8x3:5 s4x4:2" bench/verify_sweep.sh [MODEL] [OUT]
# Environment: SPECS (V:T pairs), KVGRAPH (binary, default build/cuda/kvgraph),
# UNTIL (skip the rest once the script has run this many seconds).
set -uo pipefail
MODEL=${1:-synthetic:llama3.1-8b}
OUT=${2:-/tmp}
SPECS=${SPECS:-"p8u1:5 s8x3:5 s4x4:5 s4x6:5 h4u1:5 p4u2:2 s4x4:2 p8u1:8 s8x3:8 s4x4:8"}
KVGRAPH=${KVGRAPH:-build/cuda/kvgraph}
UNTIL=${UNTIL:-100000}
status=0
for spec in $SPECS; do
  [ "$SECONDS" -gt "$UNTIL" ] && { echo "[verify_sweep] out of time before $spec" >&2; break; }
  v=${spec%:*} t=${spec#*:}
  if ! out=$(timeout 120 "$KVGRAPH" bench --device cuda --quiet --json --models "$MODEL" --verify-tokens "$t" \
      --new-tokens 64 --tune "mt=$v" 2>&1); then
    echo "[verify_sweep] mt=$v T=$t failed:" >&2
    printf '%s\n' "$out" | tail -3 >&2
    status=1
    continue
  fi
  printf '%s\n' "$out" | grep '^{' | python3 -c '
import json, sys
for line in sys.stdin:
    row = json.loads(line)
    row["mt"] = sys.argv[1]
    print(json.dumps(row))
    t, d, v, r = (row[k] for k in ("verify_tokens", "decode_ms_median", "verify_ms_median", "verify_over_decode"))
    print(f"mt={sys.argv[1]:5s} T={t} decode {d:.3f} ms verify {v:.3f} ms  {r:.3f}x", file=sys.stderr)' "$v" \
    >> "$OUT/verify.jsonl"
done
exit $status
