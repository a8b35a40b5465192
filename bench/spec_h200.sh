#!/usr/bin/env bash
# Speculative decoding on one GPU (issue 16), in one call:
#  1. the cost of a recorded verify step of T = K + 1 tokens against one
#     decode step (`kvgraph bench --verify-tokens T`, prompt 512, 256 steps,
#     compiled) on synthetic shapes; the target is T = 5 on llama3.1-8b at
#     <= 1.25x a decode step;
#  2. prompt lookup on the trained default model (models/default): acceptance
#     and end-to-end decode speed-up on copy-heavy prompts, greedy (ids
#     checked equal to plain decoding) and sampled (bench/spec_lookup.py).
# JSON lines of (1) go to OUT/spec_verify.jsonl, (2) to OUT/spec_lookup_*.json.
#   bench/spec_h200.sh [MODELS] [OUT]
set -uo pipefail
MODELS=${1:-synthetic:llama3.1-8b,synthetic:llama3.2-1b,synthetic:qwen2.5-0.5b}
OUT=${2:-/tmp}
: > "$OUT/spec_verify.jsonl"
for t in 2 5 8; do
  build/cuda/kvgraph bench --device cuda --quiet --json --models "$MODELS" --verify-tokens "$t" \
    >> "$OUT/spec_verify.jsonl" || echo "bench --verify-tokens $t failed (rc $?)"
done
python3 - "$OUT/spec_verify.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"{'model':<28} {'T':>2} {'decode ms':>10} {'verify ms':>10} {'verify/decode':>14} {'+ rollback ms':>14}")
for r in rows:
    print(f"{r['model']:<28} {r['verify_tokens']:>2} {r['decode_ms_median']:>10.3f} {r['verify_ms_median']:>10.3f} "
          f"{r['verify_over_decode']:>13.2f}x {r['verify_with_rollback_ms_median']:>14.3f}")
PY
for mode in greedy sampled; do
  python3 bench/spec_lookup.py --bin build/cuda/kvgraph --device cuda --repeats 3 \
    $([[ $mode == sampled ]] && echo --sampled) --json "$OUT/spec_lookup_$mode.json" \
    || echo "spec_lookup $mode failed (rc $?)"
done
