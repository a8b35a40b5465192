#!/usr/bin/env bash
# A short device call for the fused quantized GEMM (qgemm.cu): its tests,
# racecheck and memcheck, and int4 g64 prefill through it (--tune qmma=512)
# against the dequantised slabs for cuBLAS (--tune qmma=0) at chunks
# 64..512, one binary (the choice of LinearParams::qmma_tokens' default).
# Carry build/carry_next.txz (bench/pack_carry.sh build/cuda-nc/kvgraph
# build/cuda-nc/kvgraph_gpu_tests), then: bash bench/qgemm_call.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
source bench/call_setup.sh
gpu_tests 'CudaQuantLinear.*:*CudaQuantModel*' 100
echo "== int4 g64 prefill, prompt 512: fused (qmma=512) vs slabs (qmma=0) ($SECONDS s)"
for round in 1 2; do
  for chunk in 64 128 256 512; do
    for q in 0 512; do
      timeout 90 build/cuda/kvgraph bench --device cuda --quiet --json --models synthetic:llama3.1-8b,synthetic:llama3.2-1b \
        --new-tokens 16 --weights int4 --group-size 64 --chunk $chunk --tune qmma=$q 2>/dev/null | grep '^{' |
        python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line); r["qmma"] = int(sys.argv[1]); r["round"] = int(sys.argv[2]); print(json.dumps(r))' "$q" "$round" >> "$OUT/qgemm.jsonl"
    done
  done
  [ "$SECONDS" -gt 150 ] && break
done
python3 - "$OUT/qgemm.jsonl" <<'PY'
import json, sys, collections
best = collections.defaultdict(float)
for line in open(sys.argv[1]):
    r = json.loads(line)
    k = (r["model"], r["chunk"], r["qmma"])
    best[k] = max(best[k], r["prefill_tok_s"])
for (model, chunk, q), v in sorted(best.items()):
    if q:
        s = best.get((model, chunk, 0), float("nan"))
        print(f"{model:24s} chunk {chunk:4d}  slabs {s:8.0f}  fused {v:8.0f} tok/s  {v / s:.2f}x")
PY
for tool in racecheck memcheck; do
  echo "== compute-sanitizer $tool, the fused GEMM's tests ($SECONDS s)"
  timeout 45 compute-sanitizer --tool $tool --print-limit 20 build/cuda/kvgraph_gpu_tests \
    --gtest_filter='CudaQuantLinear.PrefillFused*' 2>&1 | grep -oE 'Race reported between [A-Za-z]+ access at [A-Za-z0-9_]+|ERROR SUMMARY.*|RACECHECK SUMMARY.*|PASSED.*|FAILED.*' | sort | uniq -c
done
echo "done ($SECONDS s)"
