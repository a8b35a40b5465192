#!/usr/bin/env bash
# Quantized KV against bf16 KV, batch-1 decode on one GPU (issue 15), in one
# call per case: `kvgraph bench --json` for each KV format (bf16, int8, int4
# g64, fp8) on synthetic models (bf16 weights at the real shapes):
#   8b-128k  llama3.1-8b at a 128K context (prompt 130816, 128 new tokens)
#   1b-32k   llama3.2-1b at 32K (prompt 32512, 128 new tokens)
#   1b-512   llama3.2-1b at 512 (prompt 512, 256 new tokens)
#   8b-512   llama3.1-8b at 512
# Long contexts are taken as filled (--no-prefill: zero K/V rows, so a step
# reads the same bytes as after a real prefill, which would take minutes at
# 128K); 512 is prefilled for real. JSON lines go to OUT/kv_quant.jsonl (each
# row names its kv_dtype); the table gives decode ms/token, its share of the
# floor (weights + the KV bytes as stored), and the time against bf16 KV with
# the targets of issue 15.
#   bench/kv_quant_h200.sh [CASES] [OUT]   (CASES comma-separated; default: all four)
# Rows are appended to OUT/kv_quant.jsonl (cases can run in separate calls);
# remove it first for a fresh table.
set -uo pipefail
CASES=${1:-8b-128k,1b-32k,1b-512,8b-512}
OUT=${2:-/tmp}
JSONL="$OUT/kv_quant.jsonl"
for c in ${CASES//,/ }; do
  case $c in
    8b-128k) model=synthetic:llama3.1-8b; prompt=130816; new=128; fill=--no-prefill ;;
    1b-32k)  model=synthetic:llama3.2-1b; prompt=32512; new=128; fill=--no-prefill ;;
    1b-512)  model=synthetic:llama3.2-1b; prompt=512; new=256; fill= ;;
    8b-512)  model=synthetic:llama3.1-8b; prompt=512; new=256; fill= ;;
    *) echo "unknown case $c (8b-128k, 1b-32k, 1b-512, 8b-512)"; exit 2 ;;
  esac
  for kv in bf16 int8 int4 fp8; do
    build/cuda/kvgraph bench --device cuda --quiet --json --models "$model" --prompt "$prompt" --new-tokens "$new" \
      --kv-dtype "$kv" --kv-group 64 $fill >> "$JSONL" || echo "bench $c --kv-dtype $kv failed (rc $?)"
  done
done
python3 - "$JSONL" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
key = lambda r: (r["model"], r["prompt"])
base = {key(r): r for r in rows if r["kv_dtype"] == "bf16"}
# Targets (issue 15): time against bf16 KV at most this (None: report only).
target = {("synthetic:llama3.1-8b", 130816): {"int8": 1 / 1.25, "int4": 1 / 1.4},
          ("synthetic:llama3.2-1b", 32512): {"int8": 0.9, "int4": 0.85},
          ("synthetic:llama3.2-1b", 512): {"int8": 1.0, "int4": 1.0, "fp8": 1.0},
          ("synthetic:llama3.1-8b", 512): {"int8": 1.0, "int4": 1.0, "fp8": 1.0}}
print(f"{'model':<24} {'ctx':>7} {'kv':<9} {'KV MB/tok':>9} {'ms/token':>9} {'of floor':>9} {'vs bf16':>8} {'speed-up':>8} {'target':>8}")
for r in rows:
    b = base.get(key(r))
    ratio = r["decode_ms_median"] / b["decode_ms_median"] if b else float("nan")
    f = r["fraction_of_floor"]
    t = target.get(key(r), {}).get(r["kv_dtype"].split()[0])
    verdict = "" if t is None or r["kv_dtype"] == "bf16" else ("ok" if ratio <= t * (1.02 if t == 1.0 else 1.0) else "MISSED")
    print(f"{r['model']:<24} {r['prompt'] + r['new_tokens']:>7} {r['kv_dtype']:<9} {r['kv_bytes_per_token_avg'] / 1e6:>9.1f} "
          f"{r['decode_ms_median']:>9.3f} {(100 * f if f is not None else float('nan')):>8.1f}% {ratio:>7.3f}x "
          f"{1 / ratio:>7.2f}x {verdict + (f' <= {t:.3f}x' if t else ''):>8}")
PY
