#pragma once
// The epilogue the GEMV kernels (linear.cu) and the quantized GEMM (qgemm.cu)
// share. Only included by .cu files.
#include "kvgraph/scalar.h"
#include "ops/cuda/common.cuh"

namespace kvgraph::cuda {

// Rows n0 and n0 + 1 of token t are finished by one thread: bias, residual or
// gate. A: the GEMV's or the quantized GEMM's arguments (out, N, bias,
// residual, gated, act, as in LinearParams).
template <typename A>
__device__ __forceinline__ void gemv_epilogue(const A& a, int t, int n0, float acc0, float acc1) {
  const bool ok0 = n0 < a.N, ok1 = n0 + 1 < a.N;
  float* out = a.out + size_t(t) * (a.gated ? a.N / 2 : a.N);
  if (a.bias) {
    if (ok0) acc0 += detail::to_f32(a.bias[n0]);
    if (ok1) acc1 += detail::to_f32(a.bias[n0 + 1]);
  }
  if (a.gated) {  // N is even, n0 is even: both rows exist together
    if (ok0) out[n0 / 2] = activate(acc0, a.act) * acc1;
    return;
  }
  if (a.residual) {
    const float* res = a.residual + size_t(t) * a.N;
    if (ok0) acc0 += res[n0];
    if (ok1) acc1 += res[n0 + 1];
  }
  if (ok0) out[n0] = acc0;
  if (ok1) out[n0 + 1] = acc1;
}

}  // namespace kvgraph::cuda
