#!/usr/bin/env bash
# One call's worth of GPU checks on the H200 machine (repository root, after
# `cmake --build --preset cuda` here and carrying build/cuda/kvgraph and
# build/cuda/kvgraph_gpu_tests, build/cuda/kvgraph_kernel_bench): GPU tests,
# memcheck/racecheck, kernel reports, decode bench, and a
# per-kernel profile of one eager decode step. Logs go to $OUT (or /tmp).
#   bench/gpu_check.sh [tests] [memcheck] [racecheck] [kernels] [bench] [prefill] [attn] [peer] [profile:MODEL] [tune:K=V,K=V] ...
set -uo pipefail
OUT=${OUT:-/tmp}
mkdir -p /work; [ -e /work/main ] || ln -s "$PWD" /work/main  # tests use the compiled-in source dir
# One line per JSON row of FILE (bench --json), formatted by the f-string FMT over the row r.
jsonl_table() {
  python3 -c "import json, sys
for l in open(sys.argv[1]):
    if l.startswith('{'): print(eval('f' + repr(sys.argv[2]), {'r': json.loads(l)}))" "$1" "$2"
}
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
    prefill)  # tensor-core prefill attention (--tune prefill-attn=flash) against the legacy kernel: its tests, then
      # prefill of 512 tokens (steps of 64 and 512) and of 8192 (steps of 512), JSON lines in $OUT/prefill.jsonl
      build/cuda/kvgraph_gpu_tests --gtest_brief=1 --gtest_filter='Tunings/*:All/CudaAttentionFlat.*:All/CudaAttentionRing.*:CudaAttention.*:CudaSession.FlashPrefillAttentionMatchesLegacyOnSyntheticModels' \
        > "$OUT/prefill_tests.txt" 2>&1
      echo "prefill tests rc $?"; grep -E "^\[ *(FAILED|PASSED) |Failure|\[flash\]" "$OUT/prefill_tests.txt" | head -20
      : > "$OUT/prefill.jsonl"
      for run in "512 64" "512 512" "8192 512"; do
        set -- $run
        for t in legacy flash; do
          build/cuda/kvgraph bench --device cuda --quiet --json --models synthetic:llama3.1-8b,synthetic:llama3.2-1b \
            --prompt "$1" --chunk "$2" --new-tokens 16 --tune prefill-attn=$t >> "$OUT/prefill.jsonl" || echo "bench $run $t failed"
        done
      done
      jsonl_table "$OUT/prefill.jsonl" "{r['model']:<24} prompt {r['prompt']:>5} chunk {r['chunk']:>4} \
{r['tuning'].split('prefill-attn=')[1]:<7} {r['prefill_tok_s']:>9.0f} tok/s  ttft {r['ttft_ms']:8.1f} ms" ;;
    attn)  # the decode attention kernels (--tune attn=fast|staged|mma; ATTN_MODES picks them): the staged and
      # tensor-core kernels' tests, racecheck of them, then decode at 512 / 8K / 32K keys (and 128K on the 8B
      # shape) under each, JSON lines in $OUT/attn.jsonl
      F='All/CudaAttentionFlat.*staged*:All/CudaAttentionFlat.*mma*:All/CudaAttentionRing.*:CudaAttention.*'
      build/cuda/kvgraph_gpu_tests --gtest_brief=1 --gtest_filter="$F" > "$OUT/attn_tests.txt" 2>&1
      echo "attn tests rc $?"; grep -E "^\[ *(FAILED|PASSED) |Failure" "$OUT/attn_tests.txt" | head -20
      timeout 240 compute-sanitizer --tool racecheck --error-exitcode 7 build/cuda/kvgraph_gpu_tests --gtest_brief=1 \
        --gtest_filter="${ATTN_RACECHECK_FILTER:-All/CudaAttentionFlat.*mma*:All/CudaAttentionFlat.*D128*staged*}" \
        > "$OUT/attn_racecheck.txt" 2>&1
      echo "attn racecheck rc $?"; grep -E "RACECHECK SUMMARY|FAILED" "$OUT/attn_racecheck.txt" | head -3
      : > "$OUT/attn.jsonl"
      for run in "synthetic:llama3.1-8b,synthetic:llama3.2-1b,synthetic:gemma3-1b 512" \
                 "synthetic:llama3.1-8b,synthetic:llama3.2-1b,synthetic:gemma3-1b 8192" \
                 "synthetic:llama3.1-8b,synthetic:llama3.2-1b,synthetic:gemma3-1b 32768" "synthetic:llama3.1-8b 131072"; do
        set -- $run
        for t in ${ATTN_MODES:-fast staged mma}; do
          build/cuda/kvgraph bench --device cuda --quiet --json --models "$1" --prompt "$2" --chunk 512 --new-tokens 32 \
            --tune attn=$t >> "$OUT/attn.jsonl" || echo "bench $run $t failed"
        done
      done
      jsonl_table "$OUT/attn.jsonl" "{r['model']:<24} prompt {r['prompt']:>6} {r['tuning'].split(',')[1]:<12} \
decode {r['decode_ms_median']:7.3f} ms  of floor {r.get('fraction_of_floor') or 0:.3f}" ;;
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
