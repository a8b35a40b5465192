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
# The ring GEMV's cp.async may meet the ptxas pattern that broke the 64x3
# qring (docs/design.md: a descriptor in an odd uniform register, illegal
# instruction at launch): count such LDGSTS per kernel before running it.
echo "== LDGSTS with odd-register descriptors ($SECONDS s)"
cuobjdump -sass build/cuda/kvgraph 2>/dev/null | awk '/Function :/ {f = $3} /LDGSTS.*desc\[UR[13579]\]/ {n[f]++} END {for (k in n) print n[k], k}' | c++filt | cut -c1-160 | head -20
# Two processes: an illegal instruction in one kernel ends its process's tests.
echo "== GPU tests: prefetch and embedding ($SECONDS s)"
timeout 150 build/cuda/kvgraph_gpu_tests --gtest_filter='BackendOps.*:CudaAttention.*:CudaKvQuant.*' 2>&1 |
  grep -E '^\[  (PASSED|FAILED) |^\[==========\]|FAILED|Failure' | tail -12
echo "== GPU tests: several-token GEMV variants ($SECONDS s)"
timeout 120 build/cuda/kvgraph_gpu_tests --gtest_filter='CudaMultiToken.*:CudaSpeculative.*' 2>&1 |
  grep -E '^\[  (PASSED|FAILED) |^\[==========\]|FAILED|Failure' | tail -12
echo "== verify variants ($SECONDS s)"
UNTIL=$((DL * 45 / 100)) bench/verify_sweep.sh synthetic:llama3.1-8b "$OUT"
echo "== decode A/B ($SECONDS s)"
printf '#!/bin/sh\nexec %s "$@" --tune attn-prefetch=on\n' "$PWD/build/cuda/kvgraph" > build/cuda/kvgraph_pf
chmod +x build/cuda/kvgraph_pf
left=$((DL - SECONDS))
[ "$left" -gt 60 ] && BINS="build/cuda/kvgraph_base build/cuda/kvgraph build/cuda/kvgraph_pf" OUT=$OUT \
  timeout "$left" bench/ab.sh - "--kv-dtype int8"
echo "done ($SECONDS s)"
