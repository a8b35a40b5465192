#!/usr/bin/env bash
# Quantized vs bf16 batch-1 decode on one GPU, in one call: `kvgraph bench`
# (prompt 512, 256 new tokens, compiled) per weight format on synthetic
# models (random codes at the real shapes: the bytes a checkpoint of that
# format streams; int8 x through the streamed kernel, the register one
# (qgemv=regs) and f32 x). Prints a table with the speed-up over bf16; JSON lines go
# to OUT/quant.jsonl (each row names its "weights").
#   bench/quant_h200.sh [MODELS] [OUT]
set -uo pipefail
MODELS=${1:-synthetic:llama3.1-8b,synthetic:llama3.2-1b,synthetic:qwen2.5-0.5b,synthetic:gemma3-1b}
OUT=${2:-/tmp}
: > "$OUT/quant.jsonl"
for w in bf16 int8 int4 int8:qgemv=regs int4:qgemv=regs int8:qx=f32 int4:qx=f32; do
  tune=""; [[ $w == *:* ]] && tune=${w#*:} && w=${w%%:*}
  build/cuda/kvgraph bench --device cuda --quiet --json --models "$MODELS" --weights "$w" --group-size 64 \
    ${tune:+--tune "$tune"} >> "$OUT/quant.jsonl" || echo "bench --weights $w $tune failed (rc $?)"
done
python3 - "$OUT/quant.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
base = {r["model"]: r["decode_ms_median"] for r in rows if not r["weights"].startswith("int")}
print(f"{'model':<28} {'weights':<9} {'x':<12} {'MB/token':>9} {'decode ms':>10} {'of floor':>9} {'vs bf16':>8}")
for r in rows:
    mb = (r["weight_bytes_read_per_token"] + r["kv_bytes_per_token_avg"]) / 1e6
    f = r["fraction_of_floor"]
    x = ("int8 " + ("stream" if "qgemv=stream" in r["tuning"] else "regs")) if "qx=int8" in r["tuning"] else "f32"
    print(f"{r['model']:<28} {r['weights']:<9} {x:<12} {mb:>9.1f} {r['decode_ms_median']:>10.3f} "
          f"{(100 * f if f is not None else float('nan')):>8.1f}% {base[r['model']] / r['decode_ms_median']:>7.2f}x")
PY
