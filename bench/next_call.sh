#!/usr/bin/env bash
# Session 21's device call for branch wip/verify-ring (now merged: the fused
# tensor-core GEMM for prefill on quantized weights, several-token GEMV
# variants, embedding over a grid, the attention prefetch switch); a
# template for the next main-against-branch call. Carry build/carry_next.txz, made by
#   bench/pack_carry.sh MAIN/kvgraph=kvgraph_base build/cuda-nc/kvgraph build/cuda-nc/kvgraph_gpu_tests
# (both trees configured with -DCMAKE_CUDA_FLAGS=--no-compress so that
# xz shares their fatbins), then: DL=420 bash bench/next_call.sh
# 0. the fused quantized GEMM's tests and the quantized model's;
# 1. A/B, main against the branch: int4 g64 decode and prefill at chunk 64
#    and 512, and bf16 (the branch must not be slower at T = 1 to land);
# 2. racecheck and memcheck of the fused GEMM's and the several-token GEMV
#    tests (the ring variants rely on each thread reading back only the slots
#    it copied);
# 3. the verify sweep at T = 5, then 2 and 8 (issue 16: T = 5 <= 1.25x).
# Each step is skipped when the call is short of time.
set -u
cd "$(dirname "$0")/.."
DL=${DL:-420}
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p build/cuda && xz -dc build/carry_next.txz | tar -C build/cuda -xf - && export LD_LIBRARY_PATH=$PWD/build/cuda/lib
echo "== LDGSTS with odd-register descriptors ($SECONDS s)"
cuobjdump -sass build/cuda/kvgraph 2>/dev/null | awk '/Function :/ {f = $3} /LDGSTS.*desc\[UR[13579]\]/ {n[f]++} END {for (k in n) print n[k], k}' | c++filt | cut -c1-160 | head -20
echo "== GPU tests: fused quantized GEMM, quantized model ($SECONDS s)"
timeout 120 build/cuda/kvgraph_gpu_tests --gtest_filter='CudaQuantLinear.Prefill*:*CudaQuantModel*' 2>&1 |
  grep -E '^\[  (PASSED|FAILED) |^\[==========\]|FAILED|Failure|Expected|Which is|error' | head -30
echo "== A/B, int4 g64, chunk 64 and 512 ($SECONDS s)"
BINS="build/cuda/kvgraph_base build/cuda/kvgraph"
mkdir -p "$OUT/int4" "$OUT/bf16"
BINS="$BINS" OUT=$OUT/int4 timeout 150 bench/ab.sh - "--chunk 512"
python3 - "$OUT/int4/ab.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r.get("ab_bin", r.get("bin", "?")), r.get("ab_config", ""), r["model"], "chunk", r["chunk"],
          "prefill %.0f tok/s" % r["prefill_tok_s"], "ttft %.1f ms" % r["ttft_ms"])
PY
echo "== decode A/B, bf16 ($SECONDS s)"
BINS="$BINS" OUT=$OUT/bf16 ARGS="--device cuda --models synthetic:llama3.1-8b,synthetic:llama3.2-1b --new-tokens 128" \
  timeout 100 bench/ab.sh -
for tool in racecheck memcheck; do
  echo "== compute-sanitizer $tool, fused quantized GEMM and several-token GEMV ($SECONDS s)"
  timeout 50 compute-sanitizer --tool $tool --error-exitcode 9 build/cuda/kvgraph_gpu_tests \
    --gtest_filter='CudaQuantLinear.PrefillFused*:CudaMultiToken.LinearRowsAreOneTokenRows' 2>&1 | tail -4
done
echo "== verify variants ($SECONDS s)"
UNTIL=$((DL - 25)) SPECS="p8u1:5 s8x3:5 s4x4:5 h4u1:5 s4x6:5 h8u1:5 h4u2:5 p8u1:2 s4x4:2 h4u1:2 p8u1:8 s8x3:8 s4x4:8 h4u1:8" \
  bench/verify_sweep.sh synthetic:llama3.1-8b "$OUT"
echo "done ($SECONDS s)"
