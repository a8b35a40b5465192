#!/usr/bin/env bash
# One call's worth of GPU checks on the H200 machine (repository root, after
# `cmake --build --preset cuda` here and carrying build/cuda/kvgraph and
# build/cuda/kvgraph_gpu_tests): GPU tests, memcheck, decode bench, and a
# per-kernel profile of one eager decode step. Logs go to $OUT (or /tmp).
#   bench/gpu_check.sh [tests] [memcheck] [bench] [peer] [profile:MODEL] [env:K=V+K=V] ...
set -uo pipefail
OUT=${OUT:-/tmp}
mkdir -p /work; [ -e /work/main ] || ln -s "$PWD" /work/main  # tests use the compiled-in source dir
MODELS=synthetic:qwen2.5-0.5b,synthetic:llama3.2-1b,synthetic:llama3.1-8b,synthetic:gemma3-1b,synthetic:mistral-7b
for step in "$@"; do
  case $step in
    tests)
      timeout "${TESTS_TIMEOUT:-600}" build/cuda/kvgraph_gpu_tests --gtest_brief=1 --gtest_filter="${TESTS_FILTER:-*}" > "$OUT/gpu_tests.txt" 2>&1
      echo "gpu tests rc $?"; grep -E "^\[ *(FAILED|PASSED) |Failure|\[attention decode|\[gemv" "$OUT/gpu_tests.txt" | head -40 ;;
    memcheck)
      timeout "${MEMCHECK_TIMEOUT:-150}" compute-sanitizer --tool memcheck --error-exitcode 7 build/cuda/kvgraph_gpu_tests --gtest_brief=1 \
        --gtest_filter="${MEMCHECK_FILTER:-CudaLinear.*:CudaAttention*:-*Long*:*Bandwidth*:*Report*}" > "$OUT/memcheck.txt" 2>&1
      echo "memcheck rc $?"; grep -E "ERROR SUMMARY|FAILED" "$OUT/memcheck.txt" | head ;;
    peer)  # kvgraph and transformers side by side (bench/run_h200.sh), JSON lines kept in $OUT
      bench/run_h200.sh qwen2.5-0.5b,llama3.2-1b,llama3.1-8b "$OUT" > "$OUT/peer.txt" 2>&1
      echo "peer rc $?"; grep -v '^{' "$OUT/peer.txt" | tail -12 ;;
    bench)
      build/cuda/kvgraph bench --device cuda --models "$MODELS" 2>&1 | tail -7 ;;
    attn:*)  # the decode shapes with KVGRAPH_ATTN set (legacy: the T > 1 kernel decodes too)
      KVGRAPH_ATTN=${step#attn:} build/cuda/kvgraph bench --device cuda --quiet \
        --models synthetic:qwen2.5-0.5b,synthetic:llama3.2-1b 2>&1 | tail -2 | sed "s/^/attn=${step#attn:} /" ;;
    env:*)  # the small decode shapes with environment switches set, e.g. env:KVGRAPH_ATTN_CHUNK=64+KVGRAPH_ATTN_HEADS=2
      spec=${step#env:}
      env ${spec//+/ } build/cuda/kvgraph bench --device cuda --quiet \
        --models "${ENV_MODELS:-synthetic:qwen2.5-0.5b,synthetic:llama3.2-1b,synthetic:gemma3-1b}" 2>&1 | grep "^synthetic" | sed "s/^/$spec /" ;;
    gemv:*)  # the three decode shapes under one GEMV launch shape (KVGRAPH_GEMV)
      KVGRAPH_GEMV=${step#gemv:} build/cuda/kvgraph bench --device cuda --quiet \
        --models synthetic:qwen2.5-0.5b,synthetic:llama3.2-1b,synthetic:llama3.1-8b 2>&1 | tail -3 | sed "s/^/${step#gemv:} /" ;;
    profile:*)
      m=${step#profile:}
      python3 bench/profile_step.py "synthetic:$m" --raw "$OUT/prof_$m.csv" > "$OUT/prof_$m.txt" 2>&1
      sed -n '/^kind/,$p' "$OUT/prof_$m.txt" ;;
  esac
done
