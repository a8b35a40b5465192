// embedding: out f32 [T, D] = table[ids[t]] * scale.
#include "ops/cuda/common.cuh"

namespace kvgraph::cuda {
namespace {

template <typename W>
__global__ void embedding_kernel(const W* __restrict__ table, int64_t vocab, const int32_t* ids  /* step state: no __restrict__, read after the PDL wait */, int D,
                                 float scale, float* __restrict__ out) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + int64_t(t) * D;
  if (id < 0 || id >= vocab) {  // the host validates ids; never read out of bounds
    for (int d = threadIdx.x; d < D; d += blockDim.x) o[d] = 0.f;
    return;
  }
  const W* row = table + int64_t(id) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) o[d] = detail::to_f32(row[d]) * scale;
}

}  // namespace

void embedding(const void* table, DType table_dtype, int64_t vocab, const int32_t* ids, int T, int D, float scale,
               float* out, Launch stream) {
  if (T < 0 || D <= 0 || vocab <= 0) fail_op("embedding", "bad shape");
  dispatch_weight(table_dtype, "embedding", [&](auto tag) {
    using W = decltype(tag);
    launch(embedding_kernel<W>, dim3(T), dim3(D >= 1024 ? 256 : 128), 0, stream, static_cast<const W*>(table),
           vocab, ids, D, scale, out);
  });
}

}  // namespace kvgraph::cuda
