#!/usr/bin/env bash
# The bf16 GEMV on the tensor cores against the default: `--tune
# gemv=mma|mma8|mma16` (weights and x of a batch in registers) and
# `gemv=mmax` (x staged through shared memory), one kernel for every T <= 8,
# and any other whole --tune string (verify-heads=N, ...).
# Carry build/carry_next.txz, made by
#   bench/pack_carry.sh build/cuda-nc/kvgraph build/cuda-nc/kvgraph_gpu_tests
# (and build/step_shape, if wanted: bench/kernels/step_shape.cu), then, e.g.
# (session 24's call, bench/results/h100-2026-12-07-session24.md, with the
# mmac variants since removed):
#   DL=450 TESTS='CudaLinear.Mma*:CudaMultiToken.*:CudaAttention.SeveralQuery*' \
#   VARIANTS="auto mmax verify-heads=1" \
#   SANITIZE='CudaLinear.MmaGemv*:CudaAttention.SeveralQuery*' PROFILE=mmax VPROFILE=verify-heads=4 \
#   bash bench/mma_call.sh
# 0. the GEMV tests (CPU reference, one-token rows == several-token rows);
# 1. decode and the T = 5 verify step, default GEMV against the mma shapes,
#    interleaved, same binary (issue 16: verify <= 1.25x decode; decode must
#    not get slower for the mma GEMV to become the default);
# 2. racecheck and memcheck on the new tests; 3. ncu of a decode step under
#    gemv=$PROFILE (bytes read and time per GEMV against the default's).
set -u
cd "$(dirname "$0")/.."
DL=${DL:-540}
OUT=${OUT:-/tmp}
source bench/call_setup.sh
gpu_tests "${TESTS:-CudaLinear.*:CudaMultiToken.*}" "${TESTS_S:-150}"
if [ -x build/step_shape ]; then  # carried: nvcc -O3 -std=c++17 -arch=sm_90 bench/kernels/step_shape.cu -o build/step_shape
  echo "== step shape: kernels vs a persistent kernel ($SECONDS s)"
  timeout 90 build/step_shape 20 2>&1 | tee "$OUT/step_shape.txt"
fi
echo "== decode and verify T=5, gemv variants ($SECONDS s)"
VARIANTS=${VARIANTS:-"auto mma mmax"}
for round in 1 2; do
  for g in $VARIANTS; do
    [ "$SECONDS" -gt $((DL - 120)) ] && { echo "out of time before round $round gemv=$g"; break 2; }
    case "$g" in *=*) tune=$g ;; *) tune="gemv=$g" ;; esac  # a variant: a GEMV name or a whole --tune string
    out=$(timeout 100 build/cuda/kvgraph bench --device cuda --quiet --json \
      --models synthetic:llama3.1-8b,synthetic:llama3.2-1b --verify-tokens 5 --new-tokens 64 --tune "$tune" 2>&1) ||
      { echo "gemv=$g failed:"; printf '%s\n' "$out" | tail -3; continue; }
    printf '%s\n' "$out" | grep '^{' | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line); r["gemv"] = sys.argv[1]; r["round"] = int(sys.argv[2])
    print(json.dumps(r))
    sys.stderr.write("%-22s %-24s decode %.3f ms (%.1f%% of floor)  verify T=5 %.3f ms  %.3fx\n" % (sys.argv[1],
        r["model"], r["decode_ms_median"], 100 * r["fraction_of_floor"], r["verify_ms_median"], r["verify_over_decode"]))' "$g" "$round" \
      >> "$OUT/gemv_mma.jsonl"
  done
done
for tool in racecheck memcheck; do
  [ "$SECONDS" -gt $((DL - 40)) ] && break
  echo "== compute-sanitizer $tool ($SECONDS s)"
  timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 build/cuda/kvgraph_gpu_tests \
    --gtest_filter="${SANITIZE:-CudaLinear.MmaGemv*}" 2>&1 | tail -3
done
PROFILE=${PROFILE:-mmax}
if [ "$SECONDS" -lt $((DL - 90)) ]; then
  echo "== ncu: GEMVs of a decode step, gemv=$PROFILE ($SECONDS s)"
  timeout $((DL - SECONDS)) python3 bench/profile_step.py synthetic:llama3.1-8b --kvgraph build/cuda/kvgraph \
    --tune gemv=$PROFILE > "$OUT/decode_profile_$PROFILE.txt" 2>&1; grep -A8 "^kind" "$OUT/decode_profile_$PROFILE.txt"
fi
if [ -n "${VPROFILE:-}" ] && [ "$SECONDS" -lt $((DL - 90)) ]; then
  echo "== ncu: a 5-token verify step, --tune $VPROFILE ($SECONDS s)"
  timeout $((DL - SECONDS)) python3 bench/profile_step.py synthetic:llama3.1-8b --kvgraph build/cuda/kvgraph --verify-tokens 5 \
    --tune "$VPROFILE" > "$OUT/verify_profile.txt" 2>&1; grep -A8 "^kind" "$OUT/verify_profile.txt"
fi
echo "done ($SECONDS s)"
