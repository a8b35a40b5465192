// RMSNorm over rows of `dim` f32 values, optionally fused with the residual add.
#include "ops/cuda/common.cuh"

namespace kvgraph::cuda {
namespace {

struct NormArgs {
  const float* x;      // rms_norm: input rows; add_rms_norm: delta rows
  float* residual;     // add_rms_norm only: residual rows (in/out), same addressing as x
  float* out;
  const void* w;
  int64_t rows;
  int heads, dim;
  int64_t x_stride, out_stride;
  float eps;
  bool plus_one;
  bool accumulate;  // out += normalised row
};

// One block per row; fixed reduction tree, so results are deterministic.
template <typename W, bool kAdd>
__global__ void rms_norm_kernel(NormArgs a) {
  __shared__ float red[32];
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int64_t r = blockIdx.x;
  const int64_t t = r / a.heads;
  const int h = static_cast<int>(r % a.heads);
  const float* x = a.x + t * a.x_stride + int64_t(h) * a.dim;
  float* o = a.out + t * a.out_stride + int64_t(h) * a.dim;
  float* res = kAdd ? a.residual + t * a.x_stride + int64_t(h) * a.dim : nullptr;
  const W* w = static_cast<const W*>(a.w);

  float ss = 0.f;
  for (int d = threadIdx.x; d < a.dim; d += blockDim.x) {
    float v = x[d];
    if constexpr (kAdd) {
      v += res[d];
      res[d] = v;
    }
    ss += v * v;
  }
  ss = detail::block_sum(ss, red);
  const float inv = rsqrtf(ss / a.dim + a.eps);
  for (int d = threadIdx.x; d < a.dim; d += blockDim.x) {
    const float v = kAdd ? res[d] : x[d];
    const float wd = detail::to_f32(w[d]);
    const float y = v * inv * (a.plus_one ? 1.0f + wd : wd);
    o[d] = a.accumulate ? o[d] + y : y;
  }
}

unsigned norm_threads(int dim) {
  int n = (dim / 4 + 31) / 32 * 32;
  return static_cast<unsigned>(n < 32 ? 32 : n > 1024 ? 1024 : n);
}

template <bool kAdd>
void run_norm(const NormArgs& a, DType w_dtype, Launch stream) {
  if (a.dim <= 0 || a.rows < 0 || a.heads <= 0) fail_op("rms_norm", "bad shape");
  if (a.rows > 0x7fffffff) fail_op("rms_norm", "too many rows");
  dispatch_weight(w_dtype, "rms_norm", [&](auto tag) {
    using W = decltype(tag);
    launch(rms_norm_kernel<W, kAdd>, dim3(static_cast<unsigned>(a.rows)), dim3(norm_threads(a.dim)), 0, stream, a);
  });
}

}  // namespace

void rms_norm(const RmsNormParams& p, Launch stream) {
  NormArgs a{};
  a.x = p.x;
  a.residual = nullptr;
  a.out = p.out;
  a.w = p.weight;
  a.rows = p.tokens * p.heads;
  a.heads = p.heads;
  a.dim = p.dim;
  a.x_stride = p.x_stride ? p.x_stride : int64_t(p.heads) * p.dim;
  a.out_stride = p.out_stride ? p.out_stride : int64_t(p.heads) * p.dim;
  a.eps = p.eps;
  a.plus_one = p.plus_one;
  a.accumulate = p.accumulate;
  if (p.accumulate && p.out == p.x) fail_op("rms_norm", "an accumulating norm must not write its input");
  run_norm<false>(a, p.weight_dtype, stream);
}

void rms_norm(const float* x, const void* w, DType w_dtype, float* out, int64_t rows, int D, float eps,
              bool plus_one, Launch stream) {
  RmsNormParams p;
  p.x = x;
  p.out = out;
  p.weight = w;
  p.weight_dtype = w_dtype;
  p.tokens = rows;
  p.heads = 1;
  p.dim = D;
  p.eps = eps;
  p.plus_one = plus_one;
  rms_norm(p, stream);
}

void add_rms_norm(float* residual, const float* delta, const void* w, DType w_dtype, float* out, int64_t rows,
                  int D, float eps, bool plus_one, Launch stream) {
  if (out == residual) fail_op("add_rms_norm", "out must not alias residual");
  NormArgs a{};
  a.x = delta;
  a.residual = residual;
  a.out = out;
  a.w = w;
  a.rows = rows;
  a.heads = 1;
  a.dim = D;
  a.x_stride = D;
  a.out_stride = D;
  a.eps = eps;
  a.plus_one = plus_one;
  run_norm<true>(a, w_dtype, stream);
}

}  // namespace kvgraph::cuda
