#!/usr/bin/env bash
# The next device call for branch wip/verify-ring (session 20 built it; no
# machine came). Carry build/carry_next.txz (bench/pack_carry.sh
# build/ab/kvgraph_base build/cuda/kvgraph build/cuda/kvgraph_gpu_tests:
# main's binary, this branch's binary and its GPU tests), then:
#   DL=540 bash bench/next_call.sh
# 1. the GPU tests that cover the branch (several-token GEMV variants, the
#    embedding over several blocks, attention with attn-prefetch=on);
# 2. the verify-step variants (bench/verify_sweep.sh, issue 16);
# 3. interleaved decode A/B: main, the branch (new embedding grid), the
#    branch with attn-prefetch=on (issue 13), int4 g64 weights, bf16 and
#    int8 KV.
set -u
cd "$(dirname "$0")/.."
DL=${DL:-540}
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p build/cuda && xz -dc build/carry_next.txz | tar -C build/cuda -xf - && export LD_LIBRARY_PATH=$PWD/build/cuda/lib
echo "== GPU tests ($SECONDS s)"
timeout 200 build/cuda/kvgraph_gpu_tests \
  --gtest_filter='CudaMultiToken.*:CudaSpeculative.*:BackendOps.*:CudaAttention.*:CudaKvQuant.*' 2>&1 |
  grep -E '^\[  (PASSED|FAILED) |^\[==========\]|FAILED|Failure' | tail -16
echo "== verify variants ($SECONDS s)"
UNTIL=$((DL * 55 / 100)) bench/verify_sweep.sh synthetic:llama3.1-8b "$OUT"
echo "== decode A/B ($SECONDS s)"
printf '#!/bin/sh\nexec %s "$@" --tune attn-prefetch=on\n' "$PWD/build/cuda/kvgraph" > build/cuda/kvgraph_pf
chmod +x build/cuda/kvgraph_pf
BINS="build/cuda/kvgraph_base build/cuda/kvgraph build/cuda/kvgraph_pf" OUT=$OUT \
  timeout $((DL - SECONDS)) bench/ab.sh - "--kv-dtype int8"
echo "done ($SECONDS s)"
