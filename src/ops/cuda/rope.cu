// Rotate-half (NeoX / Hugging Face) RoPE, position read from device memory.
#include "ops/cuda/common.cuh"

namespace kvgraph::cuda {
namespace {

__global__ void rope_kernel(RopeParams p, int64_t row_stride) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int half = p.head_dim / 2;
  const int64_t total = int64_t(p.T) * p.n_heads * half;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int i = static_cast<int>(idx % half);
  const int64_t th = idx / half;
  const int h = static_cast<int>(th % p.n_heads);
  const int64_t t = th / p.n_heads;
  // As torch: the angle is one f32 product, then precise cos/sin in f32.
  const float ang = static_cast<float>(p.pos[0] + static_cast<int32_t>(t)) * p.inv_freq[i];
  const float c = cosf(ang) * p.attention_scaling;
  const float s = sinf(ang) * p.attention_scaling;
  float* v = p.x + t * row_stride + int64_t(h) * p.head_dim;
  const float a = v[i], b = v[i + half];
  v[i] = a * c - b * s;
  v[i + half] = b * c + a * s;
}

}  // namespace

void rope(const RopeParams& p, Launch stream) {
  if (p.head_dim <= 0 || p.head_dim % 2 || p.T < 0 || p.n_heads <= 0) fail_op("rope", "bad shape");
  const int64_t stride = p.row_stride ? p.row_stride : int64_t(p.n_heads) * p.head_dim;
  const int64_t total = int64_t(p.T) * p.n_heads * (p.head_dim / 2);
  launch(rope_kernel, dim3(ceil_div(total, 256)), dim3(256), 0, stream, p, stride);
}

void rope(float* x, const int32_t* pos, const float* inv_freq, int T, int H, int head_dim, Launch stream) {
  RopeParams p;
  p.x = x;
  p.pos = pos;
  p.inv_freq = inv_freq;
  p.T = T;
  p.n_heads = H;
  p.head_dim = head_dim;
  rope(p, stream);
}

}  // namespace kvgraph::cuda
