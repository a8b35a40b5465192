#!/usr/bin/env bash
# A short device call for the fused quantized GEMM (qgemm.cu): its tests,
# racecheck (which kernels report hazards), and int4 g64 prefill, main's binary (the
# dequantised slabs for cuBLAS) against the branch's, at chunks 64..512 (the
# choice of kQGemmMaxTokens). Carry build/carry_next.txz (see next_call.sh).
set -u
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p build/cuda && xz -dc build/carry_next.txz | tar -C build/cuda -xf - && export LD_LIBRARY_PATH=$PWD/build/cuda/lib
echo "== GPU tests ($SECONDS s)"
timeout 100 build/cuda/kvgraph_gpu_tests --gtest_filter='CudaQuantLinear.Prefill*:*CudaQuantModel*' 2>&1 |
  grep -E '^\[  (PASSED|FAILED) |^\[==========\]|FAILED|Failure|Expected|Which is|error' | head -20
echo "== racecheck: kernels with hazards (cuBLAS's nvjet kernels of the slab comparison report some) ($SECONDS s)"
timeout 70 compute-sanitizer --tool racecheck --print-limit 50 build/cuda/kvgraph_gpu_tests \
  --gtest_filter='CudaQuantLinear.PrefillFused*' 2>&1 | grep -oE 'Race reported between [A-Za-z]+ access at [A-Za-z0-9_]+' | sort | uniq -c
echo "== int4 g64 prefill, chunks 64..512 ($SECONDS s)"
mkdir -p "$OUT/int4"
REPS=1 BINS="build/cuda/kvgraph_base build/cuda/kvgraph" OUT=$OUT/int4 \
  ARGS="--device cuda --models synthetic:llama3.1-8b,synthetic:llama3.2-1b --new-tokens 32 --weights int4 --group-size 64" \
  timeout 150 bench/ab.sh - "--chunk 128" "--chunk 256" "--chunk 512" > /dev/null
python3 - "$OUT/int4/ab.jsonl" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[(r["model"], r["chunk"], r["ab_bin"].split("/")[-1])] = r["prefill_tok_s"]
for (model, chunk, b), v in sorted(rows.items()):
    if b == "kvgraph":
        base = rows.get((model, chunk, "kvgraph_base"), float("nan"))
        print(f"{model:24s} chunk {chunk:4d}  main {base:8.0f}  branch {v:8.0f} tok/s  {v / base:.2f}x")
PY
echo "done ($SECONDS s)"
