// embedding: out f32 [T, D] = table[ids[t]] * scale.
#include "kvgraph/quant.h"
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

// One block per token; thread d dequantises values d, d + blockDim, ... of its row.
template <typename S, int kBits>
__global__ void embedding_affine_kernel(const uint32_t* __restrict__ words, const S* __restrict__ scales,
                                        const S* __restrict__ biases, int group, int64_t vocab,
                                        const int32_t* ids /* step state: read after the PDL wait */, int D,
                                        float scale, float* __restrict__ out) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + int64_t(t) * D;
  if (id < 0 || id >= vocab) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) o[d] = 0.f;
    return;
  }
  const uint32_t* row = words + int64_t(id) * (D / (32 / kBits));
  const int groups = D / group;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    const int64_t g = int64_t(id) * groups + d / group;
    o[d] = affine_value(detail::to_f32(scales[g]), affine_code(row, d, kBits), detail::to_f32(biases[g])) * scale;
  }
}

}  // namespace

void embedding_affine(const AffineTable& table, int64_t vocab, const int32_t* ids, int T, int D, float scale,
                      float* out, Launch stream) {
  if (T < 0 || D <= 0 || vocab <= 0) fail_op("embedding", "bad shape");
  if ((table.bits != 4 && table.bits != 8) || table.group <= 0 || D % table.group)
    fail_op("embedding", "quantized table: unsupported bits or group");
  dispatch_weight(table.scale_dtype, "embedding", [&](auto tag) {
    using S = decltype(tag);
    auto go = [&](auto kernel) {
      launch(kernel, dim3(T), dim3(D >= 1024 ? 256 : 128), 0, stream, table.words, static_cast<const S*>(table.scales),
             static_cast<const S*>(table.biases), table.group, vocab, ids, D, scale, out);
    };
    if (table.bits == 4)
      go(embedding_affine_kernel<S, 4>);
    else
      go(embedding_affine_kernel<S, 8>);
  });
}

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
