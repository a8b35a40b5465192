# Sourced by the device-call scripts (bench/mma_call.sh, bench/qgemm_call.sh):
# names the GPU, unpacks the carried binaries (bench/pack_carry.sh ->
# build/carry_next.txz) into build/cuda, and gives gpu_tests FILTER [SECONDS]:
# the GPU tests matching FILTER, their summary and failures only.
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p build/cuda && xz -dc build/carry_next.txz | tar -C build/cuda -xf - && export LD_LIBRARY_PATH=$PWD/build/cuda/lib
gpu_tests() {
  echo "== GPU tests: $1 ($SECONDS s)"
  timeout "${2:-150}" build/cuda/kvgraph_gpu_tests --gtest_filter="$1" 2>&1 |
    grep -E '^\[  (PASSED|FAILED) |^\[==========\]|FAILED|Failure|Expected|Which is|error|norm_err' | head -30
}
