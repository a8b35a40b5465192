#!/usr/bin/env bash
# A device call that checks main after a change of defaults: the GPU tests
# (the changed paths first, then the whole suite while time is left),
# racecheck and memcheck on the changed paths, and decode / verify against
# the previous defaults in the same binary. Carry build/carry_next.txz
# (bench/pack_carry.sh build/cuda-nc/kvgraph build/cuda-nc/kvgraph_gpu_tests), then
#   DL=420 FIRST='CudaAttention.*:CudaMultiToken.*:CudaLinear.*:*Speculative*' \
#   SANITIZE='CudaAttention.SeveralQuery*' VARIANTS="auto verify-heads=1" bash bench/validate_call.sh
# Extra bench arguments a variant: BENCH_ARGS. Logs and rows go to $OUT.
set -u
cd "$(dirname "$0")/.."
DL=${DL:-420}
OUT=${OUT:-/tmp}
source bench/call_setup.sh
left() { echo $((DL - SECONDS)); }
gpu_tests "${FIRST:-CudaAttention.*}" 150
if [ "$(left)" -gt 200 ]; then
  echo "== the rest of the GPU suite ($SECONDS s)"
  timeout $(($(left) - 170)) build/cuda/kvgraph_gpu_tests --gtest_brief=1 --gtest_filter="*-${FIRST:-CudaAttention.*}" > "$OUT/gpu_rest.txt" 2>&1
  echo "rc $? (124: out of time)"; grep -E '^\[  (PASSED|FAILED) |^\[==========\]|FAILED|Failure' "$OUT/gpu_rest.txt" | head -20
fi
for tool in racecheck memcheck; do
  [ "$(left)" -lt 100 ] && break
  echo "== compute-sanitizer $tool ${SANITIZE:-CudaAttention.SeveralQuery*} ($SECONDS s)"
  timeout 70 compute-sanitizer --tool $tool --error-exitcode 9 build/cuda/kvgraph_gpu_tests \
    --gtest_filter="${SANITIZE:-CudaAttention.SeveralQuery*}" > "$OUT/$tool.txt" 2>&1
  echo "rc $? (124: out of time)"; tail -3 "$OUT/$tool.txt"
done
echo "== decode and verify T=5 ($SECONDS s)"
for g in ${VARIANTS:-auto}; do
  [ "$(left)" -lt 30 ] && break
  timeout 60 build/cuda/kvgraph bench --device cuda --quiet --json --models "${MODELS:-synthetic:llama3.1-8b,synthetic:llama3.2-1b}" \
    --verify-tokens 5 --new-tokens 64 ${BENCH_ARGS:-} --tune "${g/#auto/}" 2>&1 | grep '^{' | tee -a "$OUT/validate.jsonl" |
    python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print("%-18s %-24s %-10s decode %.3f ms  verify T=5 %.3f ms  %.3fx" % (sys.argv[1], r["model"], r.get("weights", ""),
          r["decode_ms_median"], r["verify_ms_median"], r["verify_over_decode"]))' "$g"
done
echo "done ($SECONDS s)"
