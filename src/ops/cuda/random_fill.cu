// Uniform random fill for synthetic benchmark weights (f32 or bf16), the
// same counter-based generator as the CPU backend.
#include <cuda_runtime.h>

#include "kvgraph/dtype.h"
#include "kvgraph/scalar.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/runtime.h"

namespace kvgraph::cuda {

namespace {

template <typename T>
__global__ void fill_kernel(T* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = (2.0f * uniform01(seed, static_cast<uint32_t>(i & 0x7fffffff)) - 1.0f) * scale;
    if constexpr (sizeof(T) == 4)
      p[i] = v;
    else
      p[i] = f32_to_bf16(v);
  }
}

}  // namespace

void fill_uniform(void* p, DType dt, int64_t n, uint64_t seed, float scale, Launch stream) {
  const int blocks = 132 * 8;
  if (dt == DType::F32)
    fill_kernel<float><<<blocks, 256, 0, stream>>>(static_cast<float*>(p), n, seed, scale);
  else
    fill_kernel<uint16_t><<<blocks, 256, 0, stream>>>(static_cast<uint16_t*>(p), n, seed, scale);
  KVGRAPH_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvgraph::cuda
