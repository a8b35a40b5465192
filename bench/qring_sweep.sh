#!/usr/bin/env bash
# The streamed quantized GEMV's ring shapes (--tune qring=CxS[xB]) against
# each other in one call: `kvgraph bench` (prompt 512, NEW new tokens,
# compiled) per weight format and ring on synthetic models. JSON lines go to
# OUT/qring.jsonl; prints ms/token per model and ring, and the fraction of
# the bandwidth floor.
#   bench/qring_sweep.sh [WEIGHTS] [RINGS] [MODELS] [OUT] [NEW]
set -uo pipefail
WEIGHTS=${1:-int4,int8}
RINGS=${2:-auto,128x4,64x4x2,64x4,64x6,32x8}
MODELS=${3:-synthetic:llama3.1-8b,synthetic:llama3.2-1b,synthetic:qwen2.5-0.5b,synthetic:gemma3-1b}
OUT=${4:-/tmp}
NEW=${5:-128}
for w in ${WEIGHTS//,/ }; do
  for r in ${RINGS//,/ }; do
    build/cuda/kvgraph bench --device cuda --quiet --json --models "$MODELS" --weights "$w" --group-size 64 \
      --new-tokens "$NEW" --tune "qring=$r" >> "$OUT/qring.jsonl" || echo "bench --weights $w qring=$r failed (rc $?)"
  done
done
python3 - "$OUT/qring.jsonl" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    r["ring"] = re.search(r"qring=([^,]+)", r["tuning"]).group(1)
models = list(dict.fromkeys(r["model"] for r in rows))
rings = list(dict.fromkeys(r["ring"] for r in rows))
for w in dict.fromkeys(r["weights"] for r in rows):
    print(f"{w:<10}" + "".join(f"{m.split(':')[-1]:>22}" for m in models))
    for g in rings:
        cells = []
        for m in models:
            x = [r for r in rows if r["weights"] == w and r["ring"] == g and r["model"] == m]
            f = x[0]["fraction_of_floor"] if x else None
            cells.append(f"{x[0]['decode_ms_median']:>12.3f} ({100 * f:4.1f}%)" if x and f else f"{'-':>22}")
        print(f"{g:<10}" + "".join(f"{c:>22}" for c in cells))
PY
