#!/usr/bin/env bash
# One call's worth of GPU checks on the H200 machine (repository root, after
# `cmake --build --preset cuda` here and carrying build/cuda/kvgraph and
# build/cuda/kvgraph_gpu_tests, build/cuda/kvgraph_kernel_bench): GPU tests,
# memcheck/racecheck, kernel reports, decode bench, and a
# per-kernel profile of one eager decode step. Logs go to $OUT (or /tmp).
#   bench/gpu_check.sh [tests] [memcheck] [racecheck] [kernels] [bench] [peer] [profile:MODEL] [tune:K=V,K=V] ...
set -uo pipefail
OUT=${OUT:-/tmp}
mkdir -p /work; [ -e /work/main ] || ln -s "$PWD" /work/main  # tests use the compiled-in source dir
MODELS=synthetic:qwen2.5-0.5b,synthetic:llama3.2-1b,synthetic:llama3.1-8b,synthetic:gemma3-1b,synthetic:mistral-7b
for step in "$@"; do
  case $step in
    tests)
      timeout "${TESTS_TIMEOUT:-600}" build/cuda/kvgraph_gpu_tests --gtest_brief=1 --gtest_filter="${TESTS_FILTER:-*}" > "$OUT/gpu_tests.txt" 2>&1
      echo "gpu tests rc $?"; grep -E "^\[ *(FAILED|PASSED) |Failure|\[attention decode|\[gemv" "$OUT/gpu_tests.txt" | head -40 ;;
    memcheck|racecheck)  # the whole GPU suite under compute-sanitizer (MEMCHECK_FILTER narrows it)
      # racecheck reports hazards inside cuBLAS's own nvjet_* kernels (TMA and
      # mbarrier pipelines it does not model); excluding them with
      # --kernel-name-exclude kns=nvjet made the sanitizer itself fail
      # ("failed to handle a hardware exception") on 2026-12-03.
      timeout "${MEMCHECK_TIMEOUT:-540}" stdbuf -oL compute-sanitizer --tool "$step" --error-exitcode 7 \
        build/cuda/kvgraph_gpu_tests --gtest_brief=1 --gtest_filter="${MEMCHECK_FILTER:-*}" > "$OUT/$step.txt" 2>&1
      echo "$step rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAILED|tests ran|PASSED" "$OUT/$step.txt" | head ;;
    kernels)  # timed single-kernel reports (bench/kernels/kernel_bench.cpp)
      build/cuda/kvgraph_kernel_bench 2>&1 | tee "$OUT/kernels.txt" | tail -40 ;;
    peer)  # kvgraph and transformers side by side (bench/run_h200.sh), JSON lines kept in $OUT
      bench/run_h200.sh qwen2.5-0.5b,llama3.2-1b,llama3.1-8b "$OUT" > "$OUT/peer.txt" 2>&1
      echo "peer rc $?"; grep -v '^{' "$OUT/peer.txt" | tail -12 ;;
    bench)
      build/cuda/kvgraph bench --device cuda --models "$MODELS" 2>&1 | tail -7 ;;
    tune:*)  # the decode shapes under kernel tuning, e.g. tune:attn-chunk=64,attn-heads=2 or tune:gemv=warp4
      spec=${step#tune:}
      build/cuda/kvgraph bench --device cuda --quiet --tune "$spec" \
        --models "${TUNE_MODELS:-synthetic:qwen2.5-0.5b,synthetic:llama3.2-1b,synthetic:gemma3-1b}" 2>&1 | grep "^synthetic" | sed "s/^/$spec /" ;;
    profile:*)
      m=${step#profile:}
      python3 bench/profile_step.py "synthetic:$m" --raw "$OUT/prof_$m.csv" > "$OUT/prof_$m.txt" 2>&1
      sed -n '/^kind/,$p' "$OUT/prof_$m.txt" ;;
  esac
done
