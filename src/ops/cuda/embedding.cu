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
  const int t = blockIdx.x, d = blockIdx.y * blockDim.x + threadIdx.x;
  if (d >= D) return;
  const int32_t id = ids[t];
  float* o = out + int64_t(t) * D;
  if (id < 0 || id >= vocab) {  // the host validates ids; never read out of bounds
    o[d] = 0.f;
    return;
  }
  o[d] = detail::to_f32(table[int64_t(id) * D + d]) * scale;
}

// Token blockIdx.x, values blockIdx.y * blockDim.x + threadIdx.x: one value
// a thread, so a row costs one round trip to memory (one block a token,
// looping over the row, took 8-10 us at D = 2048-4096 under ncu: a
// dependent load chain at the head of every decode step).
template <typename S, int kBits>
__global__ void embedding_affine_kernel(const uint32_t* __restrict__ words, const S* __restrict__ scales,
                                        const S* __restrict__ biases, int group, int64_t vocab,
                                        const int32_t* ids /* step state: read after the PDL wait */, int D,
                                        float scale, float* __restrict__ out) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int t = blockIdx.x, d = blockIdx.y * blockDim.x + threadIdx.x;
  if (d >= D) return;
  const int32_t id = ids[t];
  float* o = out + int64_t(t) * D;
  if (id < 0 || id >= vocab) {
    o[d] = 0.f;
    return;
  }
  const uint32_t* row = words + int64_t(id) * (D / (32 / kBits));
  const int64_t g = int64_t(id) * (D / group) + d / group;
  o[d] = affine_value(detail::to_f32(scales[g]), affine_code(row, d, kBits), detail::to_f32(biases[g])) * scale;
}

constexpr int kEmbThreads = 256;
dim3 embedding_grid(int T, int D) { return dim3(T, (D + kEmbThreads - 1) / kEmbThreads); }

}  // namespace

void embedding_affine(const AffineTable& table, int64_t vocab, const int32_t* ids, int T, int D, float scale,
                      float* out, Launch stream) {
  if (T < 0 || D <= 0 || vocab <= 0) fail_op("embedding", "bad shape");
  if ((table.bits != 4 && table.bits != 8) || table.group <= 0 || D % table.group)
    fail_op("embedding", "quantized table: unsupported bits or group");
  dispatch_weight(table.scale_dtype, "embedding", [&](auto tag) {
    using S = decltype(tag);
    auto go = [&](auto kernel) {
      launch(kernel, embedding_grid(T, D), dim3(kEmbThreads), 0, stream, table.words, static_cast<const S*>(table.scales),
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
    launch(embedding_kernel<W>, embedding_grid(T, D), dim3(kEmbThreads), 0, stream, static_cast<const W*>(table),
           vocab, ids, D, scale, out);
  });
}

}  // namespace kvgraph::cuda
