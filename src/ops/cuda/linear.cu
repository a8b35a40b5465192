// linear: out = x @ w^T (+ bias) (+ residual), or gated (act(gate) * up),
// optionally with x RMS-normalised first (LinearParams::norm).
//   T <= kMaxGemvTokens: our own bandwidth-bound GEMV (graph-capturable, no
//           allocation); the norm is folded in (template flag kNorm). Every
//           token's row is summed exactly as a one-token GEMV sums it (the
//           same threads per row group, the same order), so a speculative
//           verify step's rows are bitwise decode steps'.
//   T  > kMaxGemvTokens: (norm into scratch,) cuBLAS GEMM, then a small epilogue kernel.
#include <cublas_v2.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>
#include <type_traits>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/epilogue.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/qgemm.h"

namespace kvgraph::cuda {
namespace {

#define KVGRAPH_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                               \
    const cublasStatus_t st_ = (call);                                                               \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                \
      fail_op("linear", std::string(#call) + " failed: " + cublasGetStatusString(st_));              \
  } while (0)

constexpr int kBlock = 128;  // threads per GEMV block

template <typename W>
struct GemvArgs {
  const W* w;         // [N, K]
  const float* x;     // [K]
  const W* bias;      // [N] or null
  const float* residual;  // [N] or null; may alias out
  float* out;         // [N], or [N / 2] with a gate
  int N, K;
  bool gated;
  Activation act;  // of the gate
  // RMSNorm prologue (kernels instantiated with kNorm only): g_k = norm_add + norm[k],
  // norm_add = 1 for plus_one, else 0 (0 + g == g up to the sign of a zero, so one add serves both).
  const float* norm;  // f32 [K]
  float norm_add;
  float norm_eps;
  int T;  // tokens: x [T, K], out [T, N] ([T, N / 2] gated), residual [T, N]
};

// Weights stream through once per token: skip L1 and mark them evict-first in
// L2 so activations stay resident.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint4 ld_weights(const uint4* p, uint64_t pol) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(pol));
  return r;
}

// acc += dot(16 bytes of weights, the matching x values).
// x is the previous kernel's output: plain loads, never __ldg / __restrict__,
// which would let the compiler hoist them above griddepcontrol.wait (PDL).
__device__ __forceinline__ float dot16(uint4 w, const float* x, float acc, detail::bf16) {
  const float4 xa = *reinterpret_cast<const float4*>(x);
  const float4 xb = *(reinterpret_cast<const float4*>(x) + 1);
  acc = fmaf(__uint_as_float(w.x << 16), xa.x, acc);
  acc = fmaf(__uint_as_float(w.x & 0xffff0000u), xa.y, acc);
  acc = fmaf(__uint_as_float(w.y << 16), xa.z, acc);
  acc = fmaf(__uint_as_float(w.y & 0xffff0000u), xa.w, acc);
  acc = fmaf(__uint_as_float(w.z << 16), xb.x, acc);
  acc = fmaf(__uint_as_float(w.z & 0xffff0000u), xb.y, acc);
  acc = fmaf(__uint_as_float(w.w << 16), xb.z, acc);
  acc = fmaf(__uint_as_float(w.w & 0xffff0000u), xb.w, acc);
  return acc;
}
__device__ __forceinline__ float dot16(uint4 w, const float* x, float acc, float) {
  const float4 xa = *reinterpret_cast<const float4*>(x);
  acc = fmaf(__uint_as_float(w.x), xa.x, acc);
  acc = fmaf(__uint_as_float(w.y), xa.y, acc);
  acc = fmaf(__uint_as_float(w.z), xa.z, acc);
  acc = fmaf(__uint_as_float(w.w), xa.w, acc);
  return acc;
}

// Norm prologue: h = x * g for the kN values of one weight vector (x and g
// 16-byte aligned), returns ss + sum(x^2). x is read once per vector and h
// serves both rows. x: plain loads (see dot16); g is constant, plain is fine.
template <int kN>
__device__ __forceinline__ float load_normed(const float* x, const float* g, float g_add, float (&h)[kN], float ss) {
#pragma unroll
  for (int i = 0; i < kN; i += 4) {
    const float4 xv = *reinterpret_cast<const float4*>(x + i);
    const float4 gv = *reinterpret_cast<const float4*>(g + i);
    ss = fmaf(xv.x, xv.x, ss);
    ss = fmaf(xv.y, xv.y, ss);
    ss = fmaf(xv.z, xv.z, ss);
    ss = fmaf(xv.w, xv.w, ss);
    h[i] = xv.x * (g_add + gv.x);
    h[i + 1] = xv.y * (g_add + gv.y);
    h[i + 2] = xv.z * (g_add + gv.z);
    h[i + 3] = xv.w * (g_add + gv.w);
  }
  return ss;
}

// acc += dot(16 bytes of weights, the matching h values in registers).
__device__ __forceinline__ float dot16_h(uint4 w, const float (&h)[8], float acc, detail::bf16) {
  acc = fmaf(__uint_as_float(w.x << 16), h[0], acc);
  acc = fmaf(__uint_as_float(w.x & 0xffff0000u), h[1], acc);
  acc = fmaf(__uint_as_float(w.y << 16), h[2], acc);
  acc = fmaf(__uint_as_float(w.y & 0xffff0000u), h[3], acc);
  acc = fmaf(__uint_as_float(w.z << 16), h[4], acc);
  acc = fmaf(__uint_as_float(w.z & 0xffff0000u), h[5], acc);
  acc = fmaf(__uint_as_float(w.w << 16), h[6], acc);
  acc = fmaf(__uint_as_float(w.w & 0xffff0000u), h[7], acc);
  return acc;
}
__device__ __forceinline__ float dot16_h(uint4 w, const float (&h)[4], float acc, float) {
  acc = fmaf(__uint_as_float(w.x), h[0], acc);
  acc = fmaf(__uint_as_float(w.y), h[1], acc);
  acc = fmaf(__uint_as_float(w.z), h[2], acc);
  acc = fmaf(__uint_as_float(w.w), h[3], acc);
  return acc;
}

// 16 bytes of bf16 weights as f32, in element order (dot16_h's products).
__device__ __forceinline__ void widen16(uint4 w, float (&f)[8], detail::bf16) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

// Token t's finished row sums (acc[0 .. kRows), the norm's sum of squares ss):
// scaled by the norm, then bias / residual / gate, by one thread.
template <typename W, bool kNorm, int kRows>
__device__ __forceinline__ void store_rows(const GemvArgs<W>& a, int t, int n0, float* acc, float ss) {
  if constexpr (kNorm) {  // scale before bias / residual / gate
    const float inv = rsqrtf(ss / a.K + a.norm_eps);
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] *= inv;
  }
#pragma unroll
  for (int r = 0; r < kRows; r += 2) gemv_epilogue(a, t, n0 + r, acc[r], acc[r + 1]);
}

// The end of a GEMV group's work for token t: reduce each row's partial sums
// (and the norm's sum of squares) over the group's threads in a fixed order
// (deterministic), scale by the norm, then the epilogue, by the group's
// first thread. kT: the tokens the kernel carries (each has its own
// reduction slots, so token t + 1 never waits for token t's readers).
template <typename W, int kTPR, bool kNorm, int kRows, int kT>
__device__ __forceinline__ void finish_rows(const GemvArgs<W>& a, int t, int n0, int group, int tig,
                                            float (&acc)[kRows], float ss) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = detail::warp_sum(acc[r]);
  if constexpr (kNorm) ss = detail::warp_sum(ss);
  if constexpr (kTPR > 32) {
    constexpr int kWarps = kTPR / 32;
    __shared__ float red[kT][kBlock / 32][kRows + 1];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) red[t][warp][r] = acc[r];
      red[t][warp][kRows] = ss;
    }
    __syncthreads();
    if (tig != 0) return;
#pragma unroll
    for (int r = 0; r <= kRows; ++r) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red[t][group * kWarps + w][r];
      if (r < kRows) acc[r] = sum; else ss = sum;
    }
  } else {
    if (tig != 0) return;
  }
  store_rows<W, kNorm, kRows>(a, t, n0, acc, ss);
}

// The weight rows n0 .. n0 + kRows - 1 of a group (rows past N read row 0 and
// are never stored), and zeroed accumulators for kT tokens.
template <typename W, int kRows, int kT>
struct GemvRows {
  const uint4* wr[kRows];
  bool ok[kRows];
  float acc[kT][kRows], ss[kT];
  __device__ __forceinline__ GemvRows(const GemvArgs<W>& a, int n0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      ok[r] = n0 + r < a.N;
      wr[r] = reinterpret_cast<const uint4*>(a.w + size_t(ok[r] ? n0 + r : 0) * a.K);
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      ss[t] = 0.f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[t][r] = 0.f;
    }
  }
  // Token t's FMAs for weight vector vi of every row (wv[r]: its 16 bytes),
  // with the norm prologue's h = x * g and sum of squares when kNorm.
  template <bool kNorm>
  __device__ __forceinline__ void token(const GemvArgs<W>& a, int t, int vi, const uint4* wv, int stride) {
    constexpr int kVE = 16 / sizeof(W);
    const float* xt = a.x + size_t(t) * a.K + size_t(vi) * kVE;
    if constexpr (kNorm) {
      float h[kVE];
      ss[t] = load_normed(xt, a.norm + size_t(vi) * kVE, a.norm_add, h, ss[t]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[t][r] = dot16_h(wv[r * stride], h, acc[t][r], W{});
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[t][r] = dot16(wv[r * stride], xt, acc[t][r], W{});
    }
  }
};

// GEMV with 16-byte weight loads. A group of kTPR threads (a warp, or the
// whole block) computes kRows adjacent rows; thread i of a group reads
// vectors i, i + kTPR, ... of its rows, kUnroll iterations of loads issued
// before any use. The first batch of weight loads is issued before waiting
// for the previous kernel (PDL): weights never depend on it.
// kNorm: the RMSNorm prologue. Every group re-reduces the whole x (it reads
// all of x for its dot products anyway): sum(w * x * g) and sum(x^2) side by
// side, reduced in the same fixed order, and the dot products are scaled by
// rsqrt(mean(x^2) + eps) before the epilogue. kNorm == false is the plain GEMV.
// kT: the most tokens (a.T of them, each weight vector loaded once for all):
// a token's row sums take the same vectors in the same order whatever
// kUnroll, kRows and kT are, so they depend on kTPR alone.
// Requires K % (16 / sizeof(W)) == 0 and 16-byte aligned w and x (and norm).
template <typename W, int kTPR, int kUnroll, bool kNorm, int kRows, int kT>
__global__ void __launch_bounds__(kBlock) gemv_kernel(GemvArgs<W> a) {
  static_assert(kRows % 2 == 0, "rows come in (gate, up) pairs");
  constexpr int kVE = 16 / sizeof(W);  // elements per 16-byte vector
  constexpr int kGroups = kBlock / kTPR;
  const int group = threadIdx.x / kTPR, tig = threadIdx.x % kTPR;
  const int n0 = (blockIdx.x * kGroups + group) * kRows;
  const int nvec = a.K / kVE;
  const int T = kT == 1 ? 1 : a.T;
  GemvRows<W, kRows, kT> g(a, n0);
  const uint64_t pol = evict_first_policy();
  detail::griddep_launch_dependents();

  bool waited = false;
  for (int base = 0; base < nvec; base += kTPR * kUnroll) {
    uint4 wv[kRows][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int vi = base + u * kTPR + tig;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        wv[r][u] = (g.ok[r] && vi < nvec) ? ld_weights(g.wr[r] + vi, pol) : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {
      detail::griddep_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int vi = base + u * kTPR + tig;
      if (vi < nvec) {
#pragma unroll
        for (int t = 0; t < kT; ++t) {
          if (t >= T) break;
          g.template token<kNorm>(a, t, vi, &wv[0][u], kUnroll);
        }
      }
    }
  }
  if (!waited) detail::griddep_wait();

#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (t >= T) break;
    finish_rows<W, kTPR, kNorm, kRows, kT>(a, t, n0, group, tig, g.acc[t], g.ss[t]);
  }
}

// Fallback for unaligned pointers or K not a multiple of the vector width:
// one warp per pair of rows, scalar loads, each of the a.T tokens in turn
// (the same sums for any T). kNorm as in gemv_kernel.
template <typename W, bool kNorm>
__global__ void __launch_bounds__(kBlock) gemv_scalar_kernel(GemvArgs<W> a) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * (kBlock / 32) + warp) * 2;
  const bool ok0 = n0 < a.N, ok1 = n0 + 1 < a.N;
  const W* w0 = a.w + size_t(ok0 ? n0 : 0) * a.K;
  const W* w1 = a.w + size_t(ok1 ? n0 + 1 : 0) * a.K;
  for (int t = 0; t < a.T; ++t) {
    const float* x = a.x + size_t(t) * a.K;
    float acc0 = 0.f, acc1 = 0.f, ss = 0.f;
    for (int k = lane; k < a.K; k += 32) {
      float xk = x[k];
      if constexpr (kNorm) {
        ss = fmaf(xk, xk, ss);
        xk *= a.norm_add + a.norm[k];
      }
      if (ok0) acc0 = fmaf(detail::to_f32(w0[k]), xk, acc0);
      if (ok1) acc1 = fmaf(detail::to_f32(w1[k]), xk, acc1);
    }
    acc0 = detail::warp_sum(acc0);
    acc1 = detail::warp_sum(acc1);
    if constexpr (kNorm) {
      const float inv = rsqrtf(detail::warp_sum(ss) / a.K + a.norm_eps);
      acc0 *= inv;
      acc1 *= inv;
    }
    if (lane == 0) gemv_epilogue(a, t, n0, acc0, acc1);
  }
}

// The end of a several-token block's work (kBlock threads on kRows rows):
// finish_rows' sums for all tokens at once, warp sums then the warps in
// order, one __syncthreads, then one thread a token stores its rows.
template <typename W, bool kNorm, int kRows, int kT>
__device__ __forceinline__ void finish_tokens(const GemvArgs<W>& a, int n0, float (&acc)[kT][kRows], float (&ss)[kT]) {
  constexpr int kWarps = kBlock / 32;
  __shared__ float red[kT][kWarps][kRows + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < kT; ++t) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[t][r] = detail::warp_sum(acc[t][r]);
    if constexpr (kNorm) ss[t] = detail::warp_sum(ss[t]);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) red[t][warp][r] = acc[t][r];
      red[t][warp][kRows] = ss[t];
    }
  }
  __syncthreads();
  if (threadIdx.x >= kT) return;
  const int t = threadIdx.x;
  float sum[kRows + 1];
#pragma unroll
  for (int r = 0; r <= kRows; ++r) {
    sum[r] = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum[r] += red[t][w][r];
  }
  store_rows<W, kNorm, kRows>(a, t, n0, sum, sum[kRows]);
}

// Several tokens (exactly kT), long rows: the whole block on kRows rows, as
// the one-token block2 shape sums them (thread i takes vectors i, i + kBlock,
// ... in order; warps reduced in order), so every token's row is bitwise the
// one-token GEMV's. Unlike gemv_kernel, the weight loads are double buffered
// (the next kUnroll vectors a row are in flight while the T tokens' FMAs of
// the current ones run: with T tokens the compute phase is long enough to
// drain the memory pipe otherwise), the accumulators are sized for exactly
// kT tokens, and all tokens share one __syncthreads for the cross-warp sums.
// kOnce: each weight vector is widened to f32 once for all T tokens (and the
// norm's g_add + g once per vector) instead of once per token: the widening
// was as many integer ops as there are FMAs. Same FMAs in the same order.
template <typename W, int kUnroll, bool kNorm, int kRows, int kT, bool kOnce = false>
__global__ void __launch_bounds__(kBlock) gemv_tokens_kernel(GemvArgs<W> a) {
  static_assert(kRows % 2 == 0, "rows come in (gate, up) pairs");
  constexpr int kVE = 16 / sizeof(W);
  constexpr int kStep = kBlock * kUnroll;  // vectors a row per batch
  const int tig = threadIdx.x;
  const int n0 = blockIdx.x * kRows;
  const int nvec = a.K / kVE;
  GemvRows<W, kRows, kT> g(a, n0);
  float (&acc)[kT][kRows] = g.acc;
  float (&ss)[kT] = g.ss;
  const uint64_t pol = evict_first_policy();
  detail::griddep_launch_dependents();

  auto load = [&](uint4 (&wv)[kRows][kUnroll], int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int vi = base + u * kBlock + tig;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        wv[r][u] = (g.ok[r] && vi < nvec) ? ld_weights(g.wr[r] + vi, pol) : make_uint4(0, 0, 0, 0);
    }
  };
  auto compute = [&](const uint4 (&wv)[kRows][kUnroll], int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int vi = base + u * kBlock + tig;
      if (vi >= nvec) break;
      if constexpr (kOnce) {
        float wf[kRows][kVE];
#pragma unroll
        for (int r = 0; r < kRows; ++r) widen16(wv[r][u], wf[r], W{});
        float gg[kVE];
        if constexpr (kNorm) {
          const float* gp = a.norm + size_t(vi) * kVE;
#pragma unroll
          for (int i = 0; i < kVE; ++i) gg[i] = a.norm_add + gp[i];
        }
#pragma unroll
        for (int t = 0; t < kT; ++t) {
          const float* xt = a.x + size_t(t) * a.K + size_t(vi) * kVE;
          float h[kVE];
#pragma unroll
          for (int i = 0; i < kVE; i += 4) {
            const float4 xv = *reinterpret_cast<const float4*>(xt + i);
            h[i] = xv.x, h[i + 1] = xv.y, h[i + 2] = xv.z, h[i + 3] = xv.w;
          }
          if constexpr (kNorm) {  // load_normed's sums and products
#pragma unroll
            for (int i = 0; i < kVE; ++i) ss[t] = fmaf(h[i], h[i], ss[t]);
#pragma unroll
            for (int i = 0; i < kVE; ++i) h[i] *= gg[i];
          }
#pragma unroll
          for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int i = 0; i < kVE; ++i) acc[t][r] = fmaf(wf[r][i], h[i], acc[t][r]);
        }
      } else {
#pragma unroll
        for (int t = 0; t < kT; ++t) g.template token<kNorm>(a, t, vi, &wv[0][u], kUnroll);
      }
    }
  };
  uint4 wa[kRows][kUnroll], wb[kRows][kUnroll];
  load(wa, 0);
  detail::griddep_wait();
  for (int base = 0; base < nvec; base += 2 * kStep) {
    if (base + kStep < nvec) load(wb, base + kStep);
    compute(wa, base);
    if (base + kStep >= nvec) break;
    if (base + 2 * kStep < nvec) load(wa, base + 2 * kStep);
    compute(wb, base + kStep);
  }

  finish_tokens<W, kNorm, kRows, kT>(a, n0, acc, ss);
}

// f(std::integral_constant<int, T>) for a step of T = 2..kMaxGemvTokens
// tokens: the kernels are compiled for each token count.
template <typename F>
void with_token_count(int T, F&& f) {
  switch (T) {
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, kMaxGemvTokens>{}); break;
  }
}
static_assert(kMaxGemvTokens == 8, "with_token_count has a case per token count");

template <typename W, bool kNorm, int kUnroll, int kRows, bool kOnce = false>
void launch_gemv_tokens(const GemvArgs<W>& a, Launch stream) {
  with_token_count(a.T, [&](auto kt) {
    launch(gemv_tokens_kernel<W, kUnroll, kNorm, kRows, decltype(kt)::value, kOnce>, dim3(ceil_div(a.N, kRows)),
           dim3(kBlock), 0, stream, a);
  });
}

// gemv_tokens_kernel's sums with the weights streamed through shared memory:
// batch b (vector b * kBlock + tig of each of the kRows rows) goes by
// cp.async into stage b % kStages, kStages - 1 batches in flight while one
// computes, so the loads in flight no longer cost registers (p8u1 holds two
// batches in 236 registers at T = 5: two blocks an SM). Each thread reads
// back only the slots it copied itself: no barrier in the loop. The first
// batches are requested before the PDL wait.
template <typename W, bool kNorm, int kRows, int kT, int kStages>
__global__ void __launch_bounds__(kBlock) gemv_tokens_ring_kernel(GemvArgs<W> a) {
  static_assert(kRows % 2 == 0, "rows come in (gate, up) pairs");
  constexpr int kVE = 16 / sizeof(W);
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* ring = reinterpret_cast<uint4*>(smem);  // [kStages][kRows][kBlock]
  const int tig = threadIdx.x;
  const int n0 = blockIdx.x * kRows;
  const int nvec = a.K / kVE, batches = (nvec + kBlock - 1) / kBlock;
  GemvRows<W, kRows, kT> g(a, n0);
  const uint64_t pol = evict_first_policy();
  auto load = [&](int b) {  // always one commit group
    if (b < batches) {
      const int vi = b * kBlock + tig;
      uint4* st = ring + (b % kStages) * kRows * kBlock;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        cp_async16(smem_addr(st + r * kBlock + tig), g.wr[r] + (vi < nvec ? vi : 0), g.ok[r] && vi < nvec, pol);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int b = 0; b < kStages - 1; ++b) load(b);
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  for (int b = 0; b < batches; ++b) {
    load(b + kStages - 1);
    cp_async_wait<kStages - 1>();
    const int vi = b * kBlock + tig;
    if (vi < nvec) {
      const uint4* st = ring + (b % kStages) * kRows * kBlock;
      uint4 wv[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[r] = st[r * kBlock + tig];
#pragma unroll
      for (int t = 0; t < kT; ++t) g.template token<kNorm>(a, t, vi, wv, 1);
    }
  }
  cp_async_wait<0>();
  finish_tokens<W, kNorm, kRows, kT>(a, n0, g.acc, g.ss);
}

template <typename W, bool kNorm, int kRows, int kT, int kStages>
void launch_gemv_tokens_ring_as(const GemvArgs<W>& a, Launch stream) {
  constexpr size_t kSmem = size_t(kStages) * kRows * kBlock * 16;
  auto kernel = gemv_tokens_ring_kernel<W, kNorm, kRows, kT, kStages>;
  static const bool opted_in = [&] {  // the ring plus the static reduction slots may pass 48 KB
    KVGRAPH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    return true;
  }();
  (void)opted_in;
  launch(kernel, dim3(ceil_div(a.N, kRows)), dim3(kBlock), kSmem, stream, a);
}
template <typename W, bool kNorm, int kRows, int kStages>
void launch_gemv_tokens_ring(const GemvArgs<W>& a, Launch stream) {
  with_token_count(a.T, [&](auto kt) { launch_gemv_tokens_ring_as<W, kNorm, kRows, decltype(kt)::value, kStages>(a, stream); });
}

// Several tokens: the T == 1 shape's threads per row group (kTPR), so each
// row sums as it does alone; kRows rows a group (x is read once per group:
// with T tokens the x reads, not the weights, would bound a pair).
template <typename W, bool kNorm, int kTPR>
void launch_gemv_multi(const GemvArgs<W>& a, Tuning::Multi multi, Launch stream) {
  if constexpr (kTPR == kBlock && sizeof(W) == 2) {  // the pipelined exact-T kernels (bf16/f16, long rows)
    // automatic: p4u2 at T = 2, p8u1 above. H200, llama3.1-8b verify step of
    // T tokens against one decode step (2026-12-03, bench/results/
    // h200-2026-12-03-session8.md): T = 5: r4u2 1.99x, p4u2 2.00x, p2u4
    // 2.53x, p8u1 1.80x; T = 2: p4u2 1.17x (r4u2 1.21x). More rows a block
    // won, the double buffering did not: the x reads per row (f32, once per
    // token per weight vector) bound the step, not the weight stream.
    if (multi == Tuning::Multi::automatic) multi = a.T == 2 ? Tuning::Multi::p4u2 : Tuning::Multi::p8u1;
    switch (multi) {
      case Tuning::Multi::p4u2: launch_gemv_tokens<W, kNorm, 2, 4>(a, stream); return;
      case Tuning::Multi::p2u4: launch_gemv_tokens<W, kNorm, 4, 2>(a, stream); return;
      case Tuning::Multi::p8u1: launch_gemv_tokens<W, kNorm, 1, 8>(a, stream); return;
      case Tuning::Multi::h8u1: launch_gemv_tokens<W, kNorm, 1, 8, true>(a, stream); return;
      case Tuning::Multi::h4u2: launch_gemv_tokens<W, kNorm, 2, 4, true>(a, stream); return;
      case Tuning::Multi::h4u1: launch_gemv_tokens<W, kNorm, 1, 4, true>(a, stream); return;
      case Tuning::Multi::s8x3: launch_gemv_tokens_ring<W, kNorm, 8, 3>(a, stream); return;
      case Tuning::Multi::s4x4: launch_gemv_tokens_ring<W, kNorm, 4, 4>(a, stream); return;
      case Tuning::Multi::s4x6: launch_gemv_tokens_ring<W, kNorm, 4, 6>(a, stream); return;
      default: break;
    }
  }
  auto go = [&](auto kernel, int rows) {
    launch(kernel, dim3(ceil_div(a.N, rows * (kBlock / kTPR))), dim3(kBlock), 0, stream, a);
  };
  // automatic (f32 weights or short rows) is r4u2: on the H200 (2026-12-03, llama3.1-8b verify step of
  // T tokens against one decode step) T = 2 / 5 / 8 took 1.21x / 1.99x /
  // 2.92x with r4u2 against 1.38x / 2.41x / 3.50x with r8u2 (236-242
  // registers: two blocks an SM); r8u1 2.51x and r4u4 2.35x at T = 5.
  switch (multi) {
    case Tuning::Multi::r8u2: go(gemv_kernel<W, kTPR, 2, kNorm, 8, kMaxGemvTokens>, 8); break;
    case Tuning::Multi::r8u1: go(gemv_kernel<W, kTPR, 1, kNorm, 8, kMaxGemvTokens>, 8); break;
    case Tuning::Multi::r4u4: go(gemv_kernel<W, kTPR, 4, kNorm, 4, kMaxGemvTokens>, 4); break;
    default: go(gemv_kernel<W, kTPR, 2, kNorm, 4, kMaxGemvTokens>, 4); break;
  }
}

// ---------------------------------------------------------------- bf16 weights on the tensor cores, T <= kMaxGemvTokens
//
// One kernel for every T (Tuning::Gemv::mma*): a token's row sums are then
// bitwise the same in a one-token step and in a verify step of T tokens, and
// the T tokens cost about what one does (their x conversions run side by
// side on different lanes, the products on the tensor cores). mma.sync
// m16n8k16 with A = the tokens (row t: token t's x rounded to bf16, row
// 8 + t: what that rounding lost, so the sums carry ~16 bits of x, as the
// decode attention does with q) and B = 8 weight rows x 16 values of k.
// Lane (g, c) streams 16 bytes of weight row g: values 8c .. 8c + 7 of each
// 32-value chunk. Its B slots (k 2c, 2c + 1, 2c + 8, 2c + 9) of the chunk's
// two mmas are values 8c .. 8c + 3 and 8c + 4 .. 8c + 7 (a dot product takes
// any order of k, so long as A follows it), so its A slots are the same
// values of token g, and each 16-byte load feeds two mmas as it is.
// A block: 4 warps on kRG groups of 8 rows, warp w taking chunks w, w + 4,
// ... of K (kUnroll of them a batch, issued before any is used); the warps'
// partial sums (and the norm's sum of squares) add in warp order through
// shared memory. Deterministic; rows of token t depend on token t alone.
// Requires K % 8 == 0 and 16-byte aligned w, x (and norm). Not the default:
// at one token it holds half the FMA kernel's weight bytes in flight (4 KB
// a warp in 109-143 registers) and the step is 18% slower (H100,
// llama3.1-8b 6.56 vs 5.58 ms), while 5 tokens cost 1.2x one (the default's
// 1.5x). Two attempts at more bytes in flight (a cp.async ring; x read as
// used) were slower: docs/design.md.

// The end of a tensor-core GEMV block: each warp's row sums of token g
// (the hi and lo rows added) and sum of squares through shared memory, added
// in warp order, scaled by the norm, then the epilogue, a thread a row pair
// of a token.
template <bool kNorm, int kRG>
__device__ __forceinline__ void mma_gemv_finish(const GemvArgs<detail::bf16>& a, int n0, const float (&acc)[kRG][4],
                                                float ss) {
  constexpr int kWarps = kBlock / 32, kRowsB = 8 * kRG;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  __shared__ float red[kWarps][kMaxGemvTokens][kRowsB + 1];  // [.., kRowsB]: the sum of squares
  ss += __shfl_xor_sync(0xffffffffu, ss, 1);
  ss += __shfl_xor_sync(0xffffffffu, ss, 2);
#pragma unroll
  for (int rg = 0; rg < kRG; ++rg) {
    red[warp][g][8 * rg + 2 * c] = acc[rg][0] + acc[rg][2];
    red[warp][g][8 * rg + 2 * c + 1] = acc[rg][1] + acc[rg][3];
  }
  if (c == 0) red[warp][g][kRowsB] = ss;
  __syncthreads();
  constexpr int kPairs = kRowsB / 2;
  if (threadIdx.x >= a.T * kPairs) return;
  const int t = threadIdx.x / kPairs, pr = threadIdx.x % kPairs;
  float v0 = 0.f, v1 = 0.f, sq = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    v0 += red[w][t][2 * pr];
    v1 += red[w][t][2 * pr + 1];
    sq += red[w][t][kRowsB];
  }
  if constexpr (kNorm) {
    const float inv = rsqrtf(sq / a.K + a.norm_eps);
    v0 *= inv;
    v1 *= inv;
  }
  gemv_epilogue(a, t, n0 + 2 * pr, v0, v1);
}

// A chunk's A fragments from a lane's 8 values h of its token's x: under the
// norm, their squares added to ss and h *= norm_add + gv; then h as two
// rounded bf16 halves (hi, lo), in the order of the lane's weight values.
template <bool kNorm>
__device__ __forceinline__ void mma_gemv_a(float (&h)[8], const float (&gv)[8], float norm_add, float& ss,
                                           uint32_t (&af)[2][4]) {
  if constexpr (kNorm) {
#pragma unroll
    for (int i = 0; i < 8; ++i) ss = fmaf(h[i], h[i], ss);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] *= norm_add + gv[i];
  }
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    split_pair<detail::bf16>(h[4 * m], h[4 * m + 1], af[m][0], af[m][1]);
    split_pair<detail::bf16>(h[4 * m + 2], h[4 * m + 3], af[m][2], af[m][3]);
  }
}

// What the tensor-core GEMV kernels share: lane (g, c)'s weight rows (row g
// of each group of 8; rows past N read row 0 and are never stored), its
// accumulators and the norm's sum of squares, a batch of weight loads, and
// one chunk's products.
template <int kRG>
struct MmaGemvLane {
  static constexpr int kWarps = kBlock / 32;
  const uint4* wr[kRG];
  bool ok[kRG];
  float acc[kRG][4];
  float ss = 0.f;
  __device__ __forceinline__ MmaGemvLane(const GemvArgs<detail::bf16>& a, int n0, int g) {
#pragma unroll
    for (int rg = 0; rg < kRG; ++rg) {
      const int row = n0 + 8 * rg + g;
      ok[rg] = row < a.N;
      wr[rg] = reinterpret_cast<const uint4*>(a.w + size_t(ok[rg] ? row : 0) * a.K);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[rg][e] = 0.f;
    }
  }
  // The lane's 16 bytes of chunks base, base + kWarps, ... (kUnroll of
  // them), then, after the first batch only, the wait
  // for the previous kernel (PDL): weights never depend on it, x does.
  template <int kUnroll>
  __device__ __forceinline__ void load(uint4 (&wv)[kUnroll][kRG], int base, int c, int nvec, uint64_t pol,
                                       bool& waited) const {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kWarps, vi = j * 4 + c;
#pragma unroll
      for (int rg = 0; rg < kRG; ++rg)
        wv[u][rg] = (ok[rg] && vi < nvec) ? ld_weights(wr[rg] + vi, pol) : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {
      detail::griddep_wait();
      waited = true;
    }
  }
  // One chunk: h = the lane's 8 values of its token's x (zeros for no
  // token); under the norm, the sum of squares and h *= norm_add + gv; then
  // x as two rounded halves (A) against the weights (B).
  template <bool kNorm>
  __device__ __forceinline__ void chunk(float (&h)[8], const float (&gv)[8], float norm_add, const uint4 (&wv)[kRG]) {
    uint32_t af[2][4];
    mma_gemv_a<kNorm>(h, gv, norm_add, ss, af);
#pragma unroll
    for (int rg = 0; rg < kRG; ++rg) {
      Mma<detail::bf16>::mma(acc[rg], af[0], wv[rg].x, wv[rg].y);
      Mma<detail::bf16>::mma(acc[rg], af[1], wv[rg].z, wv[rg].w);
    }
  }
};

template <bool kNorm, int kRG, int kUnroll>
__global__ void __launch_bounds__(kBlock) gemv_mma_kernel(GemvArgs<detail::bf16> a) {
  constexpr int kWarps = kBlock / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int n0 = blockIdx.x * 8 * kRG;
  const int nvec = a.K / 8, nchunk = (nvec + 3) / 4;
  const bool has_x = g < a.T;
  MmaGemvLane<kRG> L(a, n0, g);
  const float4* xt = reinterpret_cast<const float4*>(a.x + size_t(has_x ? g : 0) * a.K);
  const float4* nt = reinterpret_cast<const float4*>(a.norm);
  const uint64_t pol = evict_first_policy();
  detail::griddep_launch_dependents();

  bool waited = false;
  for (int base = warp; base < nchunk; base += kWarps * kUnroll) {
    uint4 wv[kUnroll][kRG];
    L.load(wv, base, c, nvec, pol, waited);
    float4 xv[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int vi = (base + u * kWarps) * 4 + c;
      const bool live = has_x && vi < nvec;
      xv[u][0] = live ? xt[2 * vi] : make_float4(0.f, 0.f, 0.f, 0.f);
      xv[u][1] = live ? xt[2 * vi + 1] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * kWarps >= nchunk) break;  // warp-uniform
      const int vi = (base + u * kWarps) * 4 + c;
      float h[8] = {xv[u][0].x, xv[u][0].y, xv[u][0].z, xv[u][0].w, xv[u][1].x, xv[u][1].y, xv[u][1].z, xv[u][1].w};
      float gv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};  // (h is 0 where gv is)
      if (kNorm && has_x && vi < nvec) {
        const float4 g0 = nt[2 * vi], g1 = nt[2 * vi + 1];
        gv[0] = g0.x, gv[1] = g0.y, gv[2] = g0.z, gv[3] = g0.w, gv[4] = g1.x, gv[5] = g1.y, gv[6] = g1.z, gv[7] = g1.w;
      }
      L.template chunk<kNorm>(h, gv, a.norm_add, wv[u]);
    }
  }
  if (!waited) detail::griddep_wait();
  mma_gemv_finish<kNorm, kRG>(a, n0, L.acc, L.ss);
}

// gemv_mma_kernel's products with x staged through a warp's shared memory,
// so that its registers go to weights in flight (the FMA kernel's 256 bytes a
// lane): per batch, lane l loads value 32 j + l of each token's x (and of the
// norm's weights) for each of its kUnroll chunks j, one float a token, with
// the weights; each chunk's values go to the warp's slots, and lane (g, c)
// reads back its 8 values of token g. kTCap: the most tokens (2 or 8: the x
// registers a batch are kUnroll x kTCap). Same products and sums in the same
// order as gemv_mma_kernel for a given K split, so the same kernel (any
// kTCap) serves every T bitwise.
template <bool kNorm, int kRG, int kUnroll, int kTCap>
__global__ void __launch_bounds__(kBlock, 4) gemv_mma_xs_kernel(GemvArgs<detail::bf16> a) {
  constexpr int kWarps = kBlock / 32, kXRows = kTCap + (kNorm ? 1 : 0);
  __shared__ __align__(16) float xs[kWarps][kUnroll][kXRows][32];  // [.., kTCap]: the norm's weights
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int n0 = blockIdx.x * 8 * kRG;
  const int nvec = a.K / 8, nchunk = (nvec + 3) / 4;
  const int T = min(a.T, kTCap);
  const bool has_x = g < T;
  MmaGemvLane<kRG> L(a, n0, g);
  const uint64_t pol = evict_first_policy();
  detail::griddep_launch_dependents();

  bool waited = false;
  for (int base = warp; base < nchunk; base += kWarps * kUnroll) {
    uint4 wv[kUnroll][kRG];
    L.load(wv, base, c, nvec, pol, waited);
    float xv[kUnroll][kXRows];  // value 32 j + lane of each token (and of the norm), one batch
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = (base + u * kWarps) * 32 + lane;
      const bool live = k < a.K;
#pragma unroll
      for (int t = 0; t < kTCap; ++t) xv[u][t] = (live && t < T) ? a.x[size_t(t) * a.K + k] : 0.f;
      if constexpr (kNorm) xv[u][kTCap] = live ? __ldg(a.norm + k) : 0.f;
    }
    __syncwarp();  // the previous batch's slots have been read
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kXRows; ++r) xs[warp][u][r][lane] = xv[u][r];
    __syncwarp();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * kWarps >= nchunk) break;  // warp-uniform
      float h[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, gv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (has_x) {
        const float4 x0 = *reinterpret_cast<const float4*>(&xs[warp][u][g][8 * c]);
        const float4 x1 = *reinterpret_cast<const float4*>(&xs[warp][u][g][8 * c + 4]);
        h[0] = x0.x, h[1] = x0.y, h[2] = x0.z, h[3] = x0.w, h[4] = x1.x, h[5] = x1.y, h[6] = x1.z, h[7] = x1.w;
        if constexpr (kNorm) {
          const float4 g0 = *reinterpret_cast<const float4*>(&xs[warp][u][kTCap][8 * c]);
          const float4 g1 = *reinterpret_cast<const float4*>(&xs[warp][u][kTCap][8 * c + 4]);
          gv[0] = g0.x, gv[1] = g0.y, gv[2] = g0.z, gv[3] = g0.w, gv[4] = g1.x, gv[5] = g1.y, gv[6] = g1.z, gv[7] = g1.w;
        }
      }
      L.template chunk<kNorm>(h, gv, a.norm_add, wv[u]);
    }
  }
  if (!waited) detail::griddep_wait();
  mma_gemv_finish<kNorm, kRG>(a, n0, L.acc, L.ss);
}

bool is_mma_shape(GemvShape s) {
  return s == GemvShape::mma || s == GemvShape::mma8 || s == GemvShape::mma16 || s == GemvShape::mmax;
}

// mmax: gemv_mma_xs_kernel, 16 rows a block while that gives two blocks an
// SM, else 8; x slots for 2 tokens at T <= 2, else 8 (the same sums).
template <bool kNorm>
void launch_gemv_mma_xs(const GemvArgs<detail::bf16>& a, Launch stream) {
  const bool wide = ceil_div(a.N, 16) >= 2 * sm_count(), few = a.T <= 2;
  if (wide)
    launch(few ? gemv_mma_xs_kernel<kNorm, 2, 8, 2> : gemv_mma_xs_kernel<kNorm, 2, 6, kMaxGemvTokens>,
           dim3(ceil_div(a.N, 16)), dim3(kBlock), 0, stream, a);
  else
    launch(few ? gemv_mma_xs_kernel<kNorm, 1, 12, 2> : gemv_mma_xs_kernel<kNorm, 1, 8, kMaxGemvTokens>,
           dim3(ceil_div(a.N, 8)), dim3(kBlock), 0, stream, a);
}

// mma: 16 rows a block while that still gives two blocks an SM, else 8.
template <bool kNorm>
void launch_gemv_mma(const GemvArgs<detail::bf16>& a, GemvShape shape, Launch stream) {
  if (shape == GemvShape::mmax) {
    launch_gemv_mma_xs<kNorm>(a, stream);
    return;
  }
  if (shape == GemvShape::mma) shape = ceil_div(a.N, 16) >= 2 * sm_count() ? GemvShape::mma16 : GemvShape::mma8;
  if (shape == GemvShape::mma16)
    launch(gemv_mma_kernel<kNorm, 2, 4>, dim3(ceil_div(a.N, 16)), dim3(kBlock), 0, stream, a);
  else
    launch(gemv_mma_kernel<kNorm, 1, 8>, dim3(ceil_div(a.N, 8)), dim3(kBlock), 0, stream, a);
}

template <typename W, bool kNorm>
void launch_gemv(const GemvArgs<W>& a, GemvShape shape, Tuning::Multi multi, Launch stream) {
  constexpr int kVE = 16 / sizeof(W);
  const bool aligned = a.K % kVE == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
                       (!kNorm || reinterpret_cast<uintptr_t>(a.norm) % 16 == 0);
  const int pairs = (a.N + 1) / 2;
  if (!aligned) {
    launch(gemv_scalar_kernel<W, kNorm>, dim3(ceil_div(pairs, kBlock / 32)), dim3(kBlock), 0, stream, a);
    return;
  }
  if constexpr (std::is_same_v<W, detail::bf16>) {
    if (is_mma_shape(shape)) {  // every T: one kernel
      launch_gemv_mma<kNorm>(a, shape, stream);
      return;
    }
  }
  if (is_mma_shape(shape)) shape = GemvShape::automatic;  // f32 / f16 weights
  const int nvec = a.K / kVE;
  if (shape == GemvShape::automatic) {
    // Whole-step timings on the H200 (bench/results/h200-2026-12-02-session3.md):
    // a block per pair of rows from 256 vectors a row (K >= 2048 at bf16), else
    // a warp per pair. warp4 wins some shapes alone (CudaLinear.
    // GemvBandwidthReport) but lost whole steps each time it was tried.
    shape = nvec >= 2 * kBlock ? GemvShape::block2 : GemvShape::warp2;
  }
  if (a.T > 1) {
    if (shape == GemvShape::block2)
      launch_gemv_multi<W, kNorm, kBlock>(a, multi, stream);
    else
      launch_gemv_multi<W, kNorm, 32>(a, multi, stream);
    return;
  }
  switch (shape) {
    case GemvShape::block2:  // the whole block on one pair of rows (long rows)
      if (nvec >= 4 * kBlock)  // at least 4 vectors per thread: 8 loads per row in flight
        launch(gemv_kernel<W, kBlock, 8, kNorm, 2, 1>, dim3(pairs), dim3(kBlock), 0, stream, a);
      else
        launch(gemv_kernel<W, kBlock, 2, kNorm, 2, 1>, dim3(pairs), dim3(kBlock), 0, stream, a);
      break;
    case GemvShape::warp4:  // one warp on four rows: x read once per four rows
      launch(gemv_kernel<W, 32, 4, kNorm, 4, 1>, dim3(ceil_div(a.N, 4 * (kBlock / 32))), dim3(kBlock), 0, stream, a);
      break;
    default:  // one warp per pair of rows
      launch(gemv_kernel<W, 32, 4, kNorm, 2, 1>, dim3(ceil_div(pairs, kBlock / 32)), dim3(kBlock), 0, stream, a);
      break;
  }
}

// ---------------------------------------------------------------- quantized weights, T <= kMaxGemvTokens


// dot(q, x) for the 32 (4-bit) or 16 (8-bit) quantized values of one 16-byte
// vector, x: the matching f32 values (h, registers). Each value is converted
// in place where its bits already lie below bit 23 (one LOP3 + one FADD:
// q * 2^shift exactly) and its product accumulated by shift class, each class
// rescaled by an exact power of two at the end: a plain sum of q * x products.
template <int kBits>
__device__ __forceinline__ float qdot16(uint4 w, const float* x) {
  const uint32_t wd[4] = {w.x, w.y, w.z, w.w};
  if constexpr (kBits == 4) {
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f, a4 = 0.f;  // scales 1, 16, 256, 4096, 65536
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = wd[i], hi = v >> 20;  // nibbles 5..7 at bits 0..11
      const float* xi = x + 8 * i;
      a0 = fmaf(detail::small_uint_to_f32(v & 0xFu), xi[0], a0);
      a1 = fmaf(detail::small_uint_to_f32(v & 0xF0u), xi[1], a1);
      a2 = fmaf(detail::small_uint_to_f32(v & 0xF00u), xi[2], a2);
      a3 = fmaf(detail::small_uint_to_f32(v & 0xF000u), xi[3], a3);
      a4 = fmaf(detail::small_uint_to_f32(v & 0xF0000u), xi[4], a4);
      a0 = fmaf(detail::small_uint_to_f32(hi & 0xFu), xi[5], a0);
      a1 = fmaf(detail::small_uint_to_f32(hi & 0xF0u), xi[6], a1);
      a2 = fmaf(detail::small_uint_to_f32(hi & 0xF00u), xi[7], a2);
    }
    return a0 + a1 * (1.f / 16) + a2 * (1.f / 256) + a3 * (1.f / 4096) + a4 * (1.f / 65536);
  } else {
    // Bytes 2 and 3 are shifted down first: q * 2^16 can pass 2^23.
    float a0 = 0.f, a1 = 0.f;  // scales 1, 256
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = wd[i], hi = v >> 16;
      const float* xi = x + 4 * i;
      a0 = fmaf(detail::small_uint_to_f32(v & 0xFFu), xi[0], a0);
      a1 = fmaf(detail::small_uint_to_f32(v & 0xFF00u), xi[1], a1);
      a0 = fmaf(detail::small_uint_to_f32(hi & 0xFFu), xi[2], a0);
      a1 = fmaf(detail::small_uint_to_f32(hi & 0xFF00u), xi[3], a1);
    }
    return a0 + a1 * (1.f / 256);
  }
}

// A constant (scales, biases) through the read-only path (never something an
// earlier kernel wrote: see dot16 on PDL), kept as its stored bits until
// used: converting right after the load would wait for it there, and the
// x8 kernel refills its registers one batch ahead of their use (a bf16
// scale converted at the load cost it half its bandwidth, ncu 2026-12-05).
__device__ __forceinline__ uint32_t load_const_bits(const float* p) { return __float_as_uint(__ldg(p)); }
__device__ __forceinline__ uint32_t load_const_bits(const detail::bf16* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}
__device__ __forceinline__ float const_value(uint32_t bits, float) { return __uint_as_float(bits); }
__device__ __forceinline__ float const_value(uint32_t bits, detail::bf16) { return __uint_as_float(bits << 16); }

template <typename S>
struct QGemvArgs {
  const uint32_t* w;  // [N, K * kBits / 32]
  const S* scales;    // [N, K / group]
  const S* biases;    // [N, K / group]
  int group;
  GemvArgs<S> e;      // x, bias (S), residual, out, N, K, gate, norm: as the plain GEMV (e.w unused)
};

// The kRows consecutive quantized rows from n0 a thread group streams (rows
// past N are never read: their vectors are zeros), and fetch(): one 16-byte
// code vector of row r with its group's scale and bias, zeros past the
// row's end. Groups are 32, 64 or 128 values and a vector 16 or 32, so the
// group of vector vi is vi >> vshift.
template <typename S, int kRows>
struct QRows {
  const uint4* w;
  const S* s;
  const S* b;
  int nvec, ngroups, vshift, live_rows;
  __device__ __forceinline__ QRows(const QGemvArgs<S>& a, int n0, int values_per_vec) {
    const int K = a.e.K;
    ngroups = K / a.group;
    nvec = K / values_per_vec;
    vshift = __ffs(a.group / values_per_vec) - 1;
    live_rows = min(kRows, a.e.N - n0);
    const size_t row = live_rows > 0 ? n0 : 0;
    w = reinterpret_cast<const uint4*>(a.w) + row * nvec;
    s = a.scales + row * ngroups;
    b = a.biases + row * ngroups;
  }
  // sv, bv: the stored bits (const_value gives the float; zero bits are 0.f).
  __device__ __forceinline__ void fetch(int r, int vi, uint64_t pol, uint4& wv, uint32_t& sv, uint32_t& bv) const {
    const bool live = r < live_rows && vi < nvec;
    wv = live ? ld_weights(w + size_t(r) * nvec + vi, pol) : make_uint4(0, 0, 0, 0);
    sv = live ? load_const_bits(s + size_t(r) * ngroups + (vi >> vshift)) : 0u;
    bv = live ? load_const_bits(b + size_t(r) * ngroups + (vi >> vshift)) : 0u;
  }
};

// The plain GEMV's structure (gemv_kernel) on quantized rows: per 16-byte
// vector (one group or part of one, as group >= 32 >= values per vector) the
// row's scale s and bias b give s * dot(q, h) + b * sum(h), sum(h) shared by
// the rows of a group of threads. Weights, scales and biases are constants:
// their first loads are issued before the PDL wait. kT as in gemv_kernel: a
// token's sums depend on kTPR alone.
template <typename S, int kBits, int kTPR, int kUnroll, bool kNorm, int kRows, int kT>
__global__ void __launch_bounds__(kBlock) qgemv_kernel(QGemvArgs<S> a) {
  constexpr int kVE = 128 / kBits;  // values per 16-byte vector: 32 or 16
  constexpr int kGroups = kBlock / kTPR;
  const GemvArgs<S>& e = a.e;
  const int group = threadIdx.x / kTPR, tig = threadIdx.x % kTPR;
  const int n0 = (blockIdx.x * kGroups + group) * kRows;
  const QRows<S, kRows> rows(a, n0, kVE);
  const int nvec = rows.nvec;
  const int T = kT == 1 ? 1 : e.T;
  const uint64_t pol = evict_first_policy();
  detail::griddep_launch_dependents();

  float acc[kT][kRows], ss[kT];
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    ss[t] = 0.f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[t][r] = 0.f;
  }
  bool waited = false;
  for (int base = 0; base < nvec; base += kTPR * kUnroll) {
    uint4 wv[kRows][kUnroll];
    uint32_t sv[kRows][kUnroll], bv[kRows][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int vi = base + u * kTPR + tig;
#pragma unroll
      for (int r = 0; r < kRows; ++r) rows.fetch(r, vi, pol, wv[r][u], sv[r][u], bv[r][u]);
    }
    if (!waited) {
      detail::griddep_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int vi = base + u * kTPR + tig;
      if (vi < nvec) {
#pragma unroll
        for (int t = 0; t < kT; ++t) {
          if (t >= T) break;
          const float* xt = e.x + size_t(t) * e.K + size_t(vi) * kVE;
          float h[kVE];
          if constexpr (kNorm) {
            ss[t] = load_normed(xt, e.norm + size_t(vi) * kVE, e.norm_add, h, ss[t]);
          } else {
#pragma unroll
            for (int i = 0; i < kVE; i += 4) {  // x: plain loads (written by the previous kernel)
              const float4 xv = *reinterpret_cast<const float4*>(xt + i);
              h[i] = xv.x;
              h[i + 1] = xv.y;
              h[i + 2] = xv.z;
              h[i + 3] = xv.w;
            }
          }
          float sum = 0.f;
#pragma unroll
          for (int i = 0; i < kVE; ++i) sum += h[i];
#pragma unroll
          for (int r = 0; r < kRows; ++r)
            acc[t][r] = fmaf(const_value(sv[r][u], S{}), qdot16<kBits>(wv[r][u], h),
                             fmaf(const_value(bv[r][u], S{}), sum, acc[t][r]));
        }
      }
    }
  }
  if (!waited) detail::griddep_wait();

#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (t >= T) break;
    finish_rows<S, kTPR, kNorm, kRows, kT>(e, t, n0, group, tig, acc[t], ss[t]);
  }
}

template <typename S, int kBits, bool kNorm>
void launch_qgemv(const QGemvArgs<S>& a, GemvShape shape, Launch stream) {
  constexpr int kVE = 128 / kBits;
  const int nvec = a.e.K / kVE;
  const int pairs = (a.e.N + 1) / 2;
  if (is_mma_shape(shape)) shape = GemvShape::automatic;  // (16-bit weights only)
  if (shape == GemvShape::automatic) {
    // kvgraph_kernel_bench qgemv on the H200 (2026-12-03, g64): a block per
    // pair of long rows (int4 K >= 8192, int8 K >= 4096); shorter int4 rows
    // share x over four rows a warp, int8 over two.
    if (nvec >= 2 * kBlock)
      shape = GemvShape::block2;
    else
      shape = kBits == 4 ? GemvShape::warp4 : GemvShape::warp2;
  }
  if (a.e.T > 1) {
    // As launch_gemv: the T == 1 shape's threads per row group; four rows a
    // group (eight spill: a token's dequantised x vector alone is 32 floats).
    if (shape == GemvShape::block2)
      launch(qgemv_kernel<S, kBits, kBlock, 1, kNorm, 4, kMaxGemvTokens>, dim3(ceil_div(a.e.N, 4)), dim3(kBlock), 0,
             stream, a);
    else
      launch(qgemv_kernel<S, kBits, 32, 1, kNorm, 4, kMaxGemvTokens>, dim3(ceil_div(a.e.N, 4 * (kBlock / 32))),
             dim3(kBlock), 0, stream, a);
    return;
  }
  switch (shape) {
    case GemvShape::block2:
      launch(qgemv_kernel<S, kBits, kBlock, 2, kNorm, 2, 1>, dim3(pairs), dim3(kBlock), 0, stream, a);
      break;
    case GemvShape::warp4:
      launch(qgemv_kernel<S, kBits, 32, 2, kNorm, 4, 1>, dim3(ceil_div(a.e.N, 4 * (kBlock / 32))), dim3(kBlock), 0,
             stream, a);
      break;
    default:
      launch(qgemv_kernel<S, kBits, 32, 4, kNorm, 2, 1>, dim3(ceil_div(pairs, kBlock / 32)), dim3(kBlock), 0, stream, a);
      break;
  }
}


// ---------------------------------------------------------------- quantized weights, int8 x (DP4A)

// x quantized per vector of the weights (kVE values: 32 for 4-bit codes, 16
// for 8-bit), in shared memory: the codes (int8, stored in the order the
// integer dot products want), the vector's scale (absmax / 127), sum(x) in
// f32 (for the groups' bias term) and, for 8-bit weights, sum(xq) (codes are
// offset by -128 to be signed).
struct XQ {
  int8_t* q;     // [K]
  float* scale;  // [K / kVE]
  float* sum;    // [K / kVE]
  int* qsum;     // [K / kVE]
};

__host__ __device__ __forceinline__ XQ xq_layout(unsigned char* smem, int K, int kVE) {
  XQ x;
  x.q = reinterpret_cast<int8_t*>(smem);
  x.scale = reinterpret_cast<float*>(smem + K);
  x.sum = x.scale + K / kVE;
  x.qsum = reinterpret_cast<int*>(x.sum + K / kVE);
  return x;
}

__device__ __forceinline__ uint32_t pack4(int a, int b, int c, int d) {
  return (uint32_t(a) & 0xFFu) | ((uint32_t(b) & 0xFFu) << 8) | ((uint32_t(c) & 0xFFu) << 16) | (uint32_t(d) << 24);
}

// The int8 codes of 8 consecutive x values as dot_x8 reads them: 4-bit
// weights take the even values' codes, then the odd ones' (the nibbles'
// order after & 0x0F0F0F0F); 8-bit weights take them in order.
template <int kBits>
__device__ __forceinline__ uint2 pack_x8(const int (&q)[8]) {
  if constexpr (kBits == 4)
    return make_uint2(pack4(q[0], q[2], q[4], q[6]), pack4(q[1], q[3], q[5], q[7]));
  else
    return make_uint2(pack4(q[0], q[1], q[2], q[3]), pack4(q[4], q[5], q[6], q[7]));
}

// Chunks c0 + b * blockDim.x + threadIdx.x (b < kBatch) of 8 floats each
// from p into v, zeros past nchunks; every load issued before any is used.
template <int kBatch>
__device__ __forceinline__ void load8(const float* p, int c0, int nchunks, float (&v)[kBatch][8]) {
#pragma unroll
  for (int b = 0; b < kBatch; ++b) {
    const int c = c0 + b * blockDim.x + threadIdx.x;
    float4 lo = make_float4(0.f, 0.f, 0.f, 0.f), hi = lo;
    if (c < nchunks) {
      lo = *reinterpret_cast<const float4*>(p + 8 * c);
      hi = *reinterpret_cast<const float4*>(p + 8 * c + 4);
    }
    v[b][0] = lo.x; v[b][1] = lo.y; v[b][2] = lo.z; v[b][3] = lo.w;
    v[b][4] = hi.x; v[b][5] = hi.y; v[b][6] = hi.z; v[b][7] = hi.w;
  }
}

// x (times the RMSNorm's weights g when kNorm) quantized into shared memory
// (the XQ layout) by the whole block, after the PDL wait, in one pass: chunk
// c = values [8c, 8c + 8), kTPV chunks per vector reduced over their kTPV
// lanes (aligned: kTPV divides 32). Each thread issues the loads of
// kXBatch chunks (x and g) before it uses the first, so a long x costs
// about one load latency per batch, not one per chunk. Quantization is
// per vector and scale-free, so the RMSNorm's 1 / rms is not applied to x
// but returned (sum(x^2) is reduced in the same pass): the caller scales
// each finished row sum by it (1 without kNorm). Ends with __syncthreads.
template <typename S, int kBits, bool kNorm, int kXBatch>
__device__ __forceinline__ float quantize_x(const GemvArgs<S>& e, const XQ& xq) {
  constexpr int kVE = 128 / kBits, kTPV = kVE / 8;
  const int K = e.K, nchunks = K / 8;
  float ss = 0.f;
  for (int c0 = 0; c0 < nchunks; c0 += kXBatch * blockDim.x) {
    float h[kXBatch][8];
    load8<kXBatch>(e.x, c0, nchunks, h);
    if constexpr (kNorm) {
      float g[kXBatch][8];
      load8<kXBatch>(e.norm, c0, nchunks, g);
#pragma unroll
      for (int b = 0; b < kXBatch; ++b)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          ss = fmaf(h[b][i], h[b][i], ss);
          h[b][i] *= e.norm_add + g[b][i];
        }
    }
#pragma unroll
    for (int b = 0; b < kXBatch; ++b) {
      const int c = c0 + b * blockDim.x + threadIdx.x;
      if (c0 + b * blockDim.x >= nchunks) break;  // uniform over the block
      float amax = 0.f, sum = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        amax = fmaxf(amax, fabsf(h[b][i]));
        sum += h[b][i];
      }
#pragma unroll
      for (int o = kTPV / 2; o > 0; o /= 2) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
      }
      const float scale = amax / 127.f;
      const float rs = amax > 0.f ? 127.f / amax : 0.f;
      int q[8], qs = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        q[i] = __float2int_rn(h[b][i] * rs);
        qs += q[i];
      }
#pragma unroll
      for (int o = kTPV / 2; o > 0; o /= 2) qs += __shfl_xor_sync(0xffffffffu, qs, o);
      if (c < nchunks) {
        *reinterpret_cast<uint2*>(xq.q + 8 * c) = pack_x8<kBits>(q);
        if (c % kTPV == 0) {
          xq.scale[c / kTPV] = scale;
          xq.sum[c / kTPV] = sum;
          xq.qsum[c / kTPV] = qs;
        }
      }
    }
  }
  if constexpr (kNorm) {
    __shared__ float red[32];
    return rsqrtf(detail::block_sum(ss, red) / K + e.norm_eps);  // (its __syncthreads publishes xq)
  } else {
    __syncthreads();
    return 1.f;
  }
}

// The integer dot product of one 16-byte code vector with its x codes (xw:
// kVE int8 values, 4 a word, in the order quantize_x stores them); qsum: the
// vector's sum of x codes (8-bit codes are offset by -128 to be signed).
template <int kBits>
__device__ __forceinline__ int dot_x8(const uint4& w, const int* xw, int qsum) {
  const uint32_t wd[4] = {w.x, w.y, w.z, w.w};
  int isum = 0;
  if constexpr (kBits == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      isum = __dp4a(int(wd[i] & 0x0F0F0F0Fu), xw[2 * i], isum);
      isum = __dp4a(int((wd[i] >> 4) & 0x0F0F0F0Fu), xw[2 * i + 1], isum);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) isum = __dp4a(int(wd[i] ^ 0x80808080u), xw[i], isum);
    isum += 128 * qsum;
  }
  return isum;
}

// Vector vi of the quantized x, from shared memory: its codes (4 a word, in
// quantize_x's order), scale, sum and (for 8-bit weights) sum of codes.
template <int kBits>
struct XVec {
  static constexpr int kVE = 128 / kBits;
  float scale, sum;
  int w[kVE / 4];
  int qsum;
  __device__ __forceinline__ XVec(const XQ& xq, int vi)
      : scale(xq.scale[vi]), sum(xq.sum[vi]), qsum(kBits == 8 ? xq.qsum[vi] : 0) {
#pragma unroll
    for (int i = 0; i < kVE / 16; ++i) {
      const uint4 t = reinterpret_cast<const uint4*>(xq.q + vi * kVE)[i];
      w[4 * i] = int(t.x); w[4 * i + 1] = int(t.y); w[4 * i + 2] = int(t.z); w[4 * i + 3] = int(t.w);
    }
  }
};

// Each warp owns quads of four consecutive rows: quad blockIdx.x * warps +
// warp, then every gridDim.x * warps quads after it (the grid is at most one
// wave, so x is normalised and quantized once per resident block, not once
// per 32 rows). Each lane streams 16-byte code vectors of its quad's rows,
// kUnroll vectors a row in flight: slot u holds vector batch * 32 * kUnroll
// + u * 32 + lane and is refilled as soon as it is used, with the next
// batch's vector or, after the quad's last batch, the next quad's first, so
// the stream does not drain between quads. Weights, scales and biases are
// constants: the first batch is requested before the PDL wait, in flight
// while the previous kernel ends and while the block normalises
// (optionally) and quantizes all of x into shared memory (each thread 8
// consecutive values; kVE / 8 threads per vector).
template <typename S, int kBits, bool kNorm, int kUnroll>
__global__ void __launch_bounds__(256) qgemv_x8_kernel(QGemvArgs<S> a) {
  constexpr int kVE = 128 / kBits, kRows = 4;
  extern __shared__ __align__(16) unsigned char smem[];
  const GemvArgs<S>& e = a.e;
  const int K = e.K, nvec = K / kVE;
  const XQ xq = xq_layout(smem, K, kVE);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int quads = (e.N + kRows - 1) / kRows, stride = gridDim.x * warps;
  const int batches = (nvec + 32 * kUnroll - 1) / (32 * kUnroll);
  int quad = blockIdx.x * warps + warp;
  QRows<S, kRows> rows(a, quad * kRows, kVE);
  const uint64_t pol = evict_first_policy();
  uint4 wv[kRows][kUnroll];
  uint32_t sv[kRows][kUnroll], bv[kRows][kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
#pragma unroll
    for (int r = 0; r < kRows; ++r) rows.fetch(r, u * 32 + lane, pol, wv[r][u], sv[r][u], bv[r][u]);
  detail::griddep_launch_dependents();
  detail::griddep_wait();

  const float inv = quantize_x<S, kBits, kNorm, 1>(e, xq);  // (one batch: the stream holds the registers)

  for (; quad < quads; quad += stride) {
    const QRows<S, kRows> next(a, (quad + stride) * kRows, kVE);
    float acc[kRows] = {0.f, 0.f, 0.f, 0.f};
    for (int batch = 0; batch < batches; ++batch) {
      const bool last = batch + 1 == batches;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int vi = batch * 32 * kUnroll + u * 32 + lane;
        if (vi < nvec) {
          const XVec<kBits> xv(xq, vi);
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const int isum = dot_x8<kBits>(wv[r][u], xv.w, xv.qsum);
            acc[r] = fmaf(const_value(sv[r][u], S{}) * xv.scale, float(isum),
                          fmaf(const_value(bv[r][u], S{}), xv.sum, acc[r]));
          }
        }
        if (last) {
#pragma unroll
          for (int r = 0; r < kRows; ++r) next.fetch(r, u * 32 + lane, pol, wv[r][u], sv[r][u], bv[r][u]);
        } else {
#pragma unroll
          for (int r = 0; r < kRows; ++r) rows.fetch(r, vi + 32 * kUnroll, pol, wv[r][u], sv[r][u], bv[r][u]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = detail::warp_sum(acc[r]);
    if (lane == 0) {
      const int n0 = quad * kRows;
#pragma unroll
      for (int r = 0; r < kRows; r += 2) gemv_epilogue(e, 0, n0 + r, acc[r] * inv, acc[r + 1] * inv);
    }
    rows = next;
  }
}

// The grid: blocks of 8 warps, one per 32 rows, or (persistent) at most as
// many as are resident at once. (Blocks of 2 warps for matrices of fewer
// than 66 such blocks, so that more SMs stream the 0.5B-1B shapes'
// attention projections, were 9-12% slower on those models on the H200,
// 2026-12-04: each block quantizes all of x.)
template <typename S, int kBits, bool kNorm, int kUnroll>
void launch_qgemv_x8_as(const QGemvArgs<S>& a, size_t smem, bool persistent, Launch stream) {
  static const int resident = [] {
    int per_sm = 0;
    KVGRAPH_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_x8_kernel<S, kBits, kNorm, kUnroll>,
                                                                     256, 48 * 1024));
    return std::max(1, per_sm) * sm_count();
  }();
  const int blocks = ceil_div(a.e.N, 32);
  launch(qgemv_x8_kernel<S, kBits, kNorm, kUnroll>, dim3(persistent ? std::min(blocks, resident) : blocks), dim3(256),
         smem, stream, a);
}

template <typename S, int kBits, bool kNorm>
void launch_qgemv_x8(const QGemvArgs<S>& a, Launch stream) {
  constexpr int kVE = 128 / kBits;
  const size_t smem = size_t(a.e.K) + size_t(a.e.K / kVE) * 12;
  if (smem > 48 * 1024) fail_op("linear", "int8 x: K = " + std::to_string(a.e.K) + " needs more than 48 KB of shared memory");
  // Measured on the H200 (bench/results/h200-2026-12-04-x8-variants.jsonl,
  // ms/token, int4 g64 8B / 1B, int8 8B / 1B): 2 slots a row, one block per
  // 32 rows: 2.74 / 0.72 / 3.83 / 0.97; 4 slots, one block per 32 rows: 3.58
  // / 1.03 / 4.61 / 1.11 (166-176 registers: one block an SM); 2 slots, one
  // wave: 2.92 / 0.74 / 4.34 / 1.02; 4 slots, one wave: 2.62 / 0.81 / 3.78 /
  // 0.92. Four slots need rows of at least 4 * 32 vectors (the 1B shape's
  // int4 rows of 2048 have 64: half the slots idle), and then one wave.
  if (a.e.K / kVE >= 4 * 32)
    launch_qgemv_x8_as<S, kBits, kNorm, 4>(a, smem, true, stream);
  else
    launch_qgemv_x8_as<S, kBits, kNorm, 2>(a, smem, false, stream);
}

// ---------------------------------------------------------------- quantized weights, int8 x, streamed through shared memory

// qgemv_x8_kernel's arithmetic with the weights staged in shared memory:
// each warp owns pairs of rows (pair blockIdx.x * warps + warp, then every
// gridDim.x * warps pairs) and copies them chunk by chunk (kQChunk 16-byte
// code vectors of both rows, the last chunk of a row possibly short, with
// the chunk's scales and biases) into its own ring of kQStages stages by
// cp.async: kQStages - 1 chunks in flight while one computes, only
// __syncwarp in the loop, no registers holding the stream (the register
// pipeline of qgemv_x8_kernel, one 256-thread block an SM at 170 registers,
// read about 2 TB/s on the H200: ncu, 2026-12-05). The first chunks are
// requested before the PDL wait; x is quantized once per block as there.
// A lane takes vectors lane, lane + 32, ... of a chunk; rows past N are
// zeros and never stored. Requires scales and biases 4-byte aligned with an
// even byte count a row, and group >= 128 / kBits (one group per vector).
template <typename S, int kBits, int kQChunk>
constexpr int qstream_aux_bytes() {  // scales of one row of a stage (group >= 32)
  return kQChunk * (128 / kBits) / 32 * int(sizeof(S));
}
template <typename S, int kBits, int kQChunk>
constexpr int qstream_stage_bytes() {  // codes [2][kQChunk][16], scales [2][aux], biases [2][aux]
  return 2 * kQChunk * 16 + 4 * qstream_aux_bytes<S, kBits, kQChunk>();
}
__host__ __device__ inline size_t qstream_x_bytes(int K, int kVE) { return (size_t(K) + size_t(K / kVE) * 12 + 15) / 16 * 16; }

template <typename S, int kBits, bool kNorm, int kQChunk, int kQStages>
__global__ void __launch_bounds__(256) qgemv_stream_kernel(QGemvArgs<S> a) {
  constexpr int kVE = 128 / kBits, NS = kQStages, kAux = qstream_aux_bytes<S, kBits, kQChunk>();
  constexpr int kStage = qstream_stage_bytes<S, kBits, kQChunk>();
  extern __shared__ __align__(16) unsigned char smem[];
  const GemvArgs<S>& e = a.e;
  const int K = e.K, nvec = K / kVE, ngroups = K / a.group;
  const int chunks = (nvec + kQChunk - 1) / kQChunk;
  const int gchunk = kQChunk * kVE / a.group;            // groups of a full chunk
  const int vshift = __ffs(a.group / kVE) - 1;           // vector -> group
  const XQ xq = xq_layout(smem, K, kVE);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  unsigned char* ring = smem + qstream_x_bytes(K, kVE) + size_t(warp) * NS * kStage;
  const int pairs = (e.N + 1) / 2, stride = gridDim.x * warps, first = blockIdx.x * warps + warp;
  const int items = first < pairs ? ((pairs - 1 - first) / stride + 1) * chunks : 0;
  const uint64_t pol = evict_first_policy();

  // Item i: chunk i % chunks of the warp's pair i / chunks, into stage i % NS;
  // always one commit group.
  auto load = [&](int i) {
    if (i < items) {
      const int pair = first + (i / chunks) * stride, ch = i % chunks;
      const int nv = min(kQChunk, nvec - ch * kQChunk), ng = nv * kVE / a.group;
      const int words = ng * int(sizeof(S)) / 4;
      unsigned char* st = ring + (i % NS) * kStage;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const bool live = 2 * pair + r < e.N;
        const size_t row = live ? 2 * pair + r : 0;
        const uint4* src = reinterpret_cast<const uint4*>(a.w) + row * nvec + ch * kQChunk;
#pragma unroll
        for (int j = 0; j < kQChunk / 32; ++j) {
          const int v = lane + 32 * j;
          cp_async16(smem_addr(st + (r * kQChunk + v) * 16), src + (v < nv ? v : 0), live && v < nv, pol);
        }
        const size_t g0 = row * ngroups + size_t(ch) * gchunk;
        for (int x = lane; x < 2 * words; x += 32) {
          const bool bias = x >= words;
          const int wd = bias ? x - words : x;
          const auto* src_b = reinterpret_cast<const unsigned char*>((bias ? a.biases : a.scales) + g0);
          cp_async4(smem_addr(st + 2 * kQChunk * 16 + ((bias ? 2 : 0) + r) * kAux + wd * 4), src_b + wd * 4, live);
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) load(i);
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const float inv = quantize_x<S, kBits, kNorm, kNorm ? 4 : 8>(e, xq);

  float acc[2] = {0.f, 0.f};
  for (int i = 0; i < items; ++i) {
    load(i + NS - 1);
    cp_async_wait<NS - 1>();
    __syncwarp();
    const unsigned char* st = ring + (i % NS) * kStage;
    const S* sc = reinterpret_cast<const S*>(st + 2 * kQChunk * 16);
    const S* bi = reinterpret_cast<const S*>(st + 2 * kQChunk * 16 + 2 * kAux);
    const int ch = i % chunks;
#pragma unroll
    for (int j = 0; j < kQChunk / 32; ++j) {
      const int v = lane + 32 * j, vi = ch * kQChunk + v;
      if (vi < nvec) {
        const XVec<kBits> xv(xq, vi);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int isum = dot_x8<kBits>(*reinterpret_cast<const uint4*>(st + (r * kQChunk + v) * 16), xv.w, xv.qsum);
          const int gi = r * (kAux / int(sizeof(S))) + (v >> vshift);
          acc[r] = fmaf(detail::to_f32(sc[gi]) * xv.scale, float(isum), fmaf(detail::to_f32(bi[gi]), xv.sum, acc[r]));
        }
      }
    }
    __syncwarp();  // every lane has read the stage: the next load may refill it
    if (ch == chunks - 1) {  // the pair's last chunk
      const float r0 = detail::warp_sum(acc[0]), r1 = detail::warp_sum(acc[1]);
      if (lane == 0) gemv_epilogue(e, 0, 2 * (first + (i / chunks) * stride), r0 * inv, r1 * inv);
      acc[0] = acc[1] = 0.f;
    }
  }
  cp_async_wait<0>();
}

// ---------------------------------------------------------------- quantized weights, int8 x, small register blocks

// x prepared once for the small-block kernel, in global memory (the XQ
// layout of quantize_x, then sum(x^2) per vector for the norm): q [K],
// scale, sum, qsum, ss [K / kVE] each. The whole scratch is kQxScratchBytes.
inline XQ xprep_layout(void* scratch, int K, int kVE, float** ss) {
  const XQ x = xq_layout(static_cast<unsigned char*>(scratch), K, kVE);
  *ss = reinterpret_cast<float*>(x.qsum + K / kVE);
  return x;
}
inline size_t xprep_bytes(int K, int kVE) { return size_t(K) + size_t(K / kVE) * 16; }

// x (times the norm's weights g when kNorm) quantized per vector of kVE
// values exactly as quantize_x does (absmax / 127, the same codes in the same
// order), by the whole grid at once: a thread a value, a vector's kVE lanes
// reduced by shuffles (kVE divides 32), the codes stored as bytes. g is read
// before the PDL wait. Each vector also gets its sum(h^2) (the norm's, before
// g), which the GEMV adds in its one reduction: the 1 / rms stays out of
// the codes as in quantize_x.
template <int kBits, bool kNorm>
__global__ void __launch_bounds__(256) xprep_kernel(const float* x, const float* g, float g_add, int K, XQ xq,
                                                    float* ssv) {
  constexpr int kVE = 128 / kBits;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const bool live = i < K;
  float gi = 1.f;
  if (kNorm && live) gi = g_add + g[i];
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const float h = live ? x[i] : 0.f;
  const float v = h * gi;
  float amax = fabsf(v), sum = v, ss = h * h;
#pragma unroll
  for (int o = kVE / 2; o > 0; o /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if constexpr (kNorm) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  }
  const float rs = amax > 0.f ? 127.f / amax : 0.f;
  const int q = __float2int_rn(v * rs);
  int qs = q;
  if constexpr (kBits == 8) {
#pragma unroll
    for (int o = kVE / 2; o > 0; o /= 2) qs += __shfl_xor_sync(0xffffffffu, qs, o);
  }
  if (!live) return;
  // pack_x8's order within each chunk of 8 values: 4-bit weights take the
  // even values' codes, then the odd ones'.
  const int j = i % 8, pos = kBits == 4 ? (j & 1) * 4 + j / 2 : j;
  xq.q[i - j + pos] = int8_t(q);
  if (i % kVE == 0) {
    const int vi = i / kVE;
    xq.scale[vi] = amax / 127.f;
    xq.sum[vi] = sum;
    xq.qsum[vi] = qs;
    if constexpr (kNorm) ssv[vi] = ss;
  }
}

// The quantized GEMV in the shape of the bf16 FMA kernel (`--tune
// qgemv=blocks`): a block of kR rows x the whole K, thread t holding vectors
// t, t + blockDim, ... (kVPT of them) of every row, all its codes, scales
// and biases requested before the PDL wait, no shared-memory ring, x read
// as xprep_kernel left it (int8 codes: about a quarter of the bytes of the
// f32 x and g each block would otherwise read from L2). The block's one
// barrier adds the rows (and the norm's sums of squares) in warp order.
// (Session 24's version quantized x per thread from f32 x and g in every
// block: llama3.1-8b int4 3.35 ms against the streamed kernel's 2.17 on the
// H100, the x re-reads alone about 7 GB of L2 traffic a step.)
template <typename S, int kBits, bool kNorm, int kR, int kVPT>
__global__ void __launch_bounds__(256) qgemv_blocks_kernel(QGemvArgs<S> a, XQ xq, const float* ssv) {
  constexpr int kVE = 128 / kBits;
  const GemvArgs<S>& e = a.e;
  const int K = e.K, nvec = K / kVE;
  const QRows<S, kR> rows(a, blockIdx.x * kR, kVE);
  const int n0 = blockIdx.x * kR;
  const uint64_t pol = evict_first_policy();
  uint4 wv[kR][kVPT];
  uint32_t sv[kR][kVPT], bv[kR][kVPT];  // stored bits (const_value)
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int j = 0; j < kVPT; ++j) rows.fetch(r, threadIdx.x + j * blockDim.x, pol, wv[r][j], sv[r][j], bv[r][j]);
  detail::griddep_launch_dependents();
  detail::griddep_wait();

  float acc[kR], ss = 0.f;
#pragma unroll
  for (int r = 0; r < kR; ++r) acc[r] = 0.f;
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    const int v = threadIdx.x + j * blockDim.x;
    if (v >= nvec) break;
    const XVec<kBits> xv(xq, v);
    if constexpr (kNorm) ss += ssv[v];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int isum = dot_x8<kBits>(wv[r][j], xv.w, xv.qsum);
      acc[r] = fmaf(const_value(sv[r][j], S{}) * xv.scale, float(isum), fmaf(const_value(bv[r][j], S{}), xv.sum, acc[r]));
    }
  }

  constexpr int kSlots = kR + (kNorm ? 1 : 0);
  __shared__ float red[256 / 32][kSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
#pragma unroll
  for (int r = 0; r < kSlots; ++r) {
    const float s = detail::warp_sum(r < kR ? acc[r] : ss);
    if (lane == 0) red[warp][r] = s;
  }
  __syncthreads();
  if (threadIdx.x < kR / 2) {
    float v0 = 0.f, v1 = 0.f, sq = 0.f;
    for (int i = 0; i < warps; ++i) {
      v0 += red[i][2 * threadIdx.x];
      v1 += red[i][2 * threadIdx.x + 1];
      if constexpr (kNorm) sq += red[i][kR];
    }
    if constexpr (kNorm) {
      const float inv = rsqrtf(sq / K + e.norm_eps);
      v0 *= inv;
      v1 *= inv;
    }
    if (n0 + 2 * int(threadIdx.x) < e.N) gemv_epilogue(e, 0, n0 + 2 * threadIdx.x, v0, v1);
  }
}

// Whether qgemv_blocks_kernel takes these weights: rows of at most 1024
// code vectors (K <= 32768 int4, 16384 int8), so a thread holds at most 4
// vectors a row and the prepared x fits kQxScratchBytes; a scratch given.
template <typename S, int kBits>
bool qblocks_fits(const QGemvArgs<S>& a, const void* scratch) {
  constexpr int kVE = 128 / kBits;
  return scratch && a.e.K / kVE <= 1024 && a.group >= kVE && xprep_bytes(a.e.K, kVE) <= kQxScratchBytes;
}

// xprep_kernel, then kVPT = the vectors a thread holds of each row (1, 2 or
// 4: at most 256 threads), kR = 8 / kVPT rows (8 code vectors a thread in
// flight; 16 KB a block at K = 4096 int4). Both launched with PDL.
template <typename S, int kBits, bool kNorm>
void launch_qgemv_blocks(const QGemvArgs<S>& a, void* scratch, Launch stream) {
  constexpr int kVE = 128 / kBits;
  const int nvec = a.e.K / kVE;
  float* ssv = nullptr;
  const XQ xq = xprep_layout(scratch, a.e.K, kVE, &ssv);
  launch(xprep_kernel<kBits, kNorm>, dim3(ceil_div(a.e.K, 256)), dim3(256), 0, stream, a.e.x, a.e.norm, a.e.norm_add,
         a.e.K, xq, ssv);
  const int vpt = nvec <= 256 ? 1 : nvec <= 512 ? 2 : 4;
  const int threads = std::max(32, int(ceil_div(ceil_div(nvec, vpt), 32)) * 32);
  switch (vpt) {
    case 1:
      launch(qgemv_blocks_kernel<S, kBits, kNorm, 8, 1>, dim3(ceil_div(a.e.N, 8)), dim3(threads), 0, stream, a, xq, ssv);
      break;
    case 2:
      launch(qgemv_blocks_kernel<S, kBits, kNorm, 4, 2>, dim3(ceil_div(a.e.N, 4)), dim3(threads), 0, stream, a, xq, ssv);
      break;
    default:
      launch(qgemv_blocks_kernel<S, kBits, kNorm, 2, 4>, dim3(ceil_div(a.e.N, 2)), dim3(threads), 0, stream, a, xq, ssv);
      break;
  }
}

// Whether qgemv_stream_kernel takes these weights (else qgemv_x8_kernel,
// which also takes rows too long for x and the ring to share a block's
// shared memory).
template <typename S, int kBits>
bool qstream_fits(const QGemvArgs<S>& a) {
  const int ngroups = a.e.K / a.group;
  return a.group >= 128 / kBits && (size_t(ngroups) * sizeof(S)) % 4 == 0 &&
         reinterpret_cast<uintptr_t>(a.scales) % 4 == 0 && reinterpret_cast<uintptr_t>(a.biases) % 4 == 0;
}

template <typename S, int kBits, bool kNorm, int kQChunk, int kQStages>
void launch_qgemv_stream_as(const QGemvArgs<S>& a, int cap, Launch stream) {
  constexpr int kVE = 128 / kBits;
  auto kernel = qgemv_stream_kernel<S, kBits, kNorm, kQChunk, kQStages>;
  const size_t smem = qstream_x_bytes(a.e.K, kVE) + size_t(8) * kQStages * qstream_stage_bytes<S, kBits, kQChunk>();
  static const bool allowed = [kernel] {  // all the dynamic shared memory a block may have
    cudaFuncAttributes fa{};
    KVGRAPH_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
    int most = 0;
    KVGRAPH_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    KVGRAPH_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most - int(fa.sharedSizeBytes)));
    return true;
  }();
  (void)allowed;
  int blocks_per_sm = 0;
  KVGRAPH_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, 256, smem));
  if (blocks_per_sm < 1) return launch_qgemv_x8<S, kBits, kNorm>(a, stream);  // x too long for x + ring
  const int pairs = (a.e.N + 1) / 2;
  const int blocks = std::min(int(ceil_div(pairs, 8)), std::min(blocks_per_sm, cap) * sm_count());
  launch(kernel, dim3(blocks), dim3(256), smem, stream, a);
}

// The ring of a T == 1 launch: chunk x stages, at most `blocks` an SM (0: as
// many as fit). Automatic: kAutoQRing.
struct QRingShape {
  int chunk, stages, blocks;
};

// 64 x 4, as many blocks an SM as fit (2 for int4 rows up to 14336 values,
// 3 for int8 rows as short as gemma3-1b's): the fastest or within 1% of it
// on every synthetic shape swept on an H100 (bench/results/
// h100-2026-12-06-qring.jsonl, prompt 512, 256 new tokens; int4 g64 8B /
// 1B / qwen2.5-0.5b / gemma3-1b 2.248 / 0.605 / 0.711 / 1.131 ms, 128x4
// 2.375 / 0.659 / 0.815 / 1.255, 64x6 and 32x8 slower still; int8 64x4
// 3.411 / 0.763 / 0.738 / 1.287 against 3.400 / 0.762 / 0.758 / 1.456
// capped at 2 blocks), and on an H200 (2.045 ms 8B int4 at 2 blocks,
// bench/results/h200-2026-12-06-qring.jsonl). No row length swept so far
// wanted another ring, so it depends on nothing.
constexpr QRingShape kAutoQRing = {64, 4, 0};

// The instantiation of Tuning::kQRings[I..] that matches r.
template <typename S, int kBits, bool kNorm, int I>
void launch_qgemv_ring(const QGemvArgs<S>& a, QRingShape r, int cap, Launch stream) {
  if constexpr (I < int(std::size(Tuning::kQRings))) {
    constexpr int kChunk = Tuning::kQRings[I][0], kStages = Tuning::kQRings[I][1];
    if (r.chunk == kChunk && r.stages == kStages)
      return launch_qgemv_stream_as<S, kBits, kNorm, kChunk, kStages>(a, cap, stream);
    return launch_qgemv_ring<S, kBits, kNorm, I + 1>(a, r, cap, stream);
  } else {
    fail_op("linear", "qring=" + std::to_string(r.chunk) + "x" + std::to_string(r.stages) + " is not a compiled ring");
  }
}

template <typename S, int kBits, bool kNorm>
void launch_qgemv_stream(const QGemvArgs<S>& a, const LinearParams& p, Launch stream) {
  const QRingShape r = p.qring_chunk ? QRingShape{p.qring_chunk, p.qring_stages, p.qring_blocks} : kAutoQRing;
  const int cap = r.blocks > 0 ? r.blocks : 1 << 20;
  launch_qgemv_ring<S, kBits, kNorm, 0>(a, r, cap, stream);
}

// T > 1: rows [n0, n0 + rows) of quantized weights dequantised to bf16 [rows, K]
// (round to nearest even of fmaf(s, q, b)), one thread per 32-bit word.
template <typename S, int kBits>
__global__ void dequant_rows_kernel(const uint32_t* w, const S* scales, const S* biases, int group, int K, int64_t n0,
                                    int rows, detail::bf16* out) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  constexpr int kPer = 32 / kBits;
  const int64_t words_per_row = K / kPer;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= words_per_row * rows) return;
  const int64_t r = i / words_per_row, c = i % words_per_row;
  const int64_t row = n0 + r;
  const uint32_t v = w[row * words_per_row + c];
  const int k0 = static_cast<int>(c * kPer);
  const int g = k0 / group;
  const float s = detail::to_f32(scales[row * (K / group) + g]), b = detail::to_f32(biases[row * (K / group) + g]);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const float q = static_cast<float>((v >> (j * kBits)) & ((1u << kBits) - 1));
    out[r * K + k0 + j] = detail::from_f32<detail::bf16>(fmaf(s, q, b));
  }
}

// ---------------------------------------------------------------- T > 1 helpers

__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = kvgraph::f32_to_bf16(x[i]);
}

// The norm prologue for T > 1: y [T, K] (O: f32, or bf16 rounded to nearest
// even for the bf16 GEMM, replacing to_bf16_kernel) = x * rsqrt(mean(x^2) +
// eps) * (g_add + g), as rms_norm_kernel computes it. One block per row, fixed
// reduction order (deterministic).
template <typename O>
__global__ void norm_rows_kernel(const float* x, const float* g, float g_add, float eps, O* y, int K) {
  __shared__ float red[32];
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const float* xr = x + int64_t(blockIdx.x) * K;
  O* yr = y + int64_t(blockIdx.x) * K;
  float ss = 0.f;
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    const float v = xr[k];
    ss = fmaf(v, v, ss);
  }
  ss = detail::block_sum(ss, red);
  const float inv = rsqrtf(ss / K + eps);
  for (int k = threadIdx.x; k < K; k += blockDim.x) yr[k] = detail::from_f32<O>(xr[k] * inv * (g_add + g[k]));
}

// Threads for norm_rows_kernel: about 4 values per thread, 32..1024.
unsigned norm_rows_threads(int K) {
  const int n = (K / 4 + 31) / 32 * 32;
  return static_cast<unsigned>(n < 32 ? 32 : n > 1024 ? 1024 : n);
}

// out [T, N] += bias [N]
template <typename W>
__global__ void bias_kernel(float* out, const W* bias, int T, int N) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < int64_t(T) * N) out[i] += detail::to_f32(bias[i % N]);
}

// out [T, N/2] = act(y[:, 2i] + b[2i]) * (y[:, 2i+1] + b[2i+1]) for y [T, N].
template <typename W>
__global__ void gate_kernel(const float* y, const W* bias, float* out, int T, int N, Activation act) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int F = N / 2;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(T) * F) return;
  const int64_t t = i / F;
  const int f = static_cast<int>(i % F);
  float g = y[t * N + 2 * f], u = y[t * N + 2 * f + 1];
  if (bias) {
    g += detail::to_f32(bias[2 * f]);
    u += detail::to_f32(bias[2 * f + 1]);
  }
  out[i] = activate(g, act) * u;
}

constexpr size_t kCublasWorkspace = size_t{32} << 20;

}  // namespace

// ---------------------------------------------------------------- GemmContext

struct GemmContext::Impl {
  cublasHandle_t handle = nullptr;
  DeviceBuffer workspace{kCublasWorkspace};
  DeviceBuffer x_bf16;  // bf16 [T, K]
  DeviceBuffer x_norm;  // f32 [T, K] (f32 weights with a norm prologue)
  DeviceBuffer y;       // f32 [T, N] (gated epilogue)
  DeviceBuffer w_bf16;  // bf16 [rows, K]: a slab of dequantised weights (quantized T > 1)
  DeviceBuffer partials;  // f32 partial sums of the quantized GEMM's split K
  DeviceBuffer xprep{kQxScratchBytes};  // the small-block quantized GEMV's prepared x

  // Grows `buf` to `bytes`; not allowed while the stream is being captured.
  static void ensure(DeviceBuffer& buf, size_t bytes, Launch stream) {
    if (buf.bytes() >= bytes) return;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    KVGRAPH_CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
    if (st != cudaStreamCaptureStatusNone)
      fail_op("linear", "GemmContext scratch too small during graph capture; call reserve() first");
    KVGRAPH_CUDA_CHECK(cudaStreamSynchronize(stream));  // the old buffer may still be in use
    buf = DeviceBuffer(bytes);
  }
};

GemmContext::GemmContext() : impl_(new Impl) {
  if (cublasCreate(&impl_->handle) != CUBLAS_STATUS_SUCCESS) {
    delete impl_;
    impl_ = nullptr;
    fail_op("linear", "cublasCreate failed");
  }
}

GemmContext::~GemmContext() {
  if (impl_) {
    if (impl_->handle) cublasDestroy(impl_->handle);
    delete impl_;
  }
}

void* GemmContext::xprep_scratch() const { return impl_->xprep.data(); }

void GemmContext::reserve(int64_t max_tokens, int64_t max_dim) {
  const size_t n = size_t(max_tokens) * size_t(max_dim);
  if (impl_->x_bf16.bytes() < n * 2) impl_->x_bf16 = DeviceBuffer(n * 2);
  if (impl_->x_norm.bytes() < n * 4) impl_->x_norm = DeviceBuffer(n * 4);
  if (impl_->y.bytes() < n * 4) impl_->y = DeviceBuffer(n * 4);
}

// ---------------------------------------------------------------- linear

namespace {

void check_quantized(const LinearParams& p) {
  if (p.qbits != 4 && p.qbits != 8) fail_op("linear", "quantized weights: bits must be 4 or 8, got " + std::to_string(p.qbits));
  if (p.group != 32 && p.group != 64 && p.group != 128)
    fail_op("linear", "quantized weights: group size must be 32, 64 or 128, got " + std::to_string(p.group));
  if (p.K % p.group) fail_op("linear", "quantized weights: K is not a multiple of the group size");
  if (!p.scales || !p.biases) fail_op("linear", "quantized weights need scales and biases");
  if (reinterpret_cast<uintptr_t>(p.w) % 16 || reinterpret_cast<uintptr_t>(p.x) % 16 ||
      (p.norm && reinterpret_cast<uintptr_t>(p.norm) % 16))
    fail_op("linear", "quantized weights: w, x and norm must be 16-byte aligned");
}

// Rows of a slab of dequantised weights: at most 32M values (64 MB of bf16).
int slab_rows(int N, int K) {
  const int64_t rows = std::max<int64_t>(256, (int64_t{32} << 20) / K);
  return static_cast<int>(std::min<int64_t>(rows, N));
}

}  // namespace

void linear(const LinearParams& p, GemmContext* gemm, Launch stream) {
  if (p.T < 1 || p.N < 1 || p.K < 1) fail_op("linear", "bad shape");
  if (!p.x || !p.w || !p.out) fail_op("linear", "null pointer");
  if (p.gated && (p.N % 2 || p.residual))
    fail_op("linear", "a gated linear needs an even N and no residual");
  if (p.qbits) check_quantized(p);

  const float norm_add = p.norm_plus_one ? 1.0f : 0.0f;

  // W: the weights' float type; for quantized weights, that of their scales,
  // biases and bias.
  dispatch_weight(p.w_dtype, "linear", [&](auto tag) {
    using W = decltype(tag);
    if (p.T <= kMaxGemvTokens) {
      GemvArgs<W> a{static_cast<const W*>(p.w), p.x, static_cast<const W*>(p.bias), p.residual, p.out,
                    p.N, p.K, p.gated, p.act, p.norm, norm_add, p.norm_eps, p.T};
      if (p.qbits) {
        QGemvArgs<W> q{static_cast<const uint32_t*>(p.w), static_cast<const W*>(p.scales),
                       static_cast<const W*>(p.biases), p.group, a};
        if (p.int8_x && p.T == 1) {  // (several tokens: the f32-x kernel below)
          if (p.qblocks && (p.qbits == 4 ? qblocks_fits<W, 4>(q, p.xprep) : qblocks_fits<W, 8>(q, p.xprep))) {
            if (p.qbits == 4)
              p.norm ? launch_qgemv_blocks<W, 4, true>(q, p.xprep, stream) : launch_qgemv_blocks<W, 4, false>(q, p.xprep, stream);
            else
              p.norm ? launch_qgemv_blocks<W, 8, true>(q, p.xprep, stream) : launch_qgemv_blocks<W, 8, false>(q, p.xprep, stream);
          } else if (p.qbits == 4) {
            if (p.qstream && qstream_fits<W, 4>(q))
              p.norm ? launch_qgemv_stream<W, 4, true>(q, p, stream) : launch_qgemv_stream<W, 4, false>(q, p, stream);
            else
              p.norm ? launch_qgemv_x8<W, 4, true>(q, stream) : launch_qgemv_x8<W, 4, false>(q, stream);
          } else {
            if (p.qstream && qstream_fits<W, 8>(q))
              p.norm ? launch_qgemv_stream<W, 8, true>(q, p, stream) : launch_qgemv_stream<W, 8, false>(q, p, stream);
            else
              p.norm ? launch_qgemv_x8<W, 8, true>(q, stream) : launch_qgemv_x8<W, 8, false>(q, stream);
          }
        } else if (p.qbits == 4) {
          p.norm ? launch_qgemv<W, 4, true>(q, p.shape, stream) : launch_qgemv<W, 4, false>(q, p.shape, stream);
        } else {
          p.norm ? launch_qgemv<W, 8, true>(q, p.shape, stream) : launch_qgemv<W, 8, false>(q, p.shape, stream);
        }
      } else if (p.norm) {
        launch_gemv<W, true>(a, p.shape, p.multi, stream);
      } else {
        launch_gemv<W, false>(a, p.shape, p.multi, stream);
      }
      return;
    }
    if (!gemm) fail_op("linear", "T > 1 needs a GemmContext");
    GemmContext::Impl& g = *gemm->impl();
    const int64_t TK = int64_t(p.T) * p.K, TN = int64_t(p.T) * p.N;
    const bool gated = p.gated;

    const void* B = p.x;
    cudaDataType_t ab_type = CUDA_R_32F;
    if (sizeof(W) == 2 || p.qbits) {  // bf16 (or dequantised) weights: x (normalised) rounded to bf16 for a tensor-core GEMM
      GemmContext::Impl::ensure(g.x_bf16, size_t(TK) * 2, stream);
      if (p.norm)
        launch(norm_rows_kernel<detail::bf16>, dim3(p.T), dim3(norm_rows_threads(p.K)), 0, stream, p.x, p.norm,
               norm_add, p.norm_eps, g.x_bf16.as<detail::bf16>(), p.K);
      else
        launch(to_bf16_kernel, dim3(ceil_div(TK, 256)), dim3(256), 0, stream, p.x, g.x_bf16.as<uint16_t>(), TK);
      B = g.x_bf16.data();
      ab_type = CUDA_R_16BF;
    } else if (p.norm) {
      GemmContext::Impl::ensure(g.x_norm, size_t(TK) * 4, stream);
      launch(norm_rows_kernel<float>, dim3(p.T), dim3(norm_rows_threads(p.K)), 0, stream, p.x, p.norm, norm_add,
             p.norm_eps, g.x_norm.as<float>(), p.K);
      B = g.x_norm.data();
    }
    if (p.qbits && p.T <= p.qmma_tokens && qgemm_fits(p)) {
      const size_t scratch = qgemm_scratch_bytes(p);
      if (scratch) GemmContext::Impl::ensure(g.partials, scratch, stream);
      qgemm(p, g.x_bf16.as<uint16_t>(), scratch ? g.partials.as<float>() : nullptr, stream);
      return;
    }
    float* C = p.out;
    float beta = 0.f;
    if (gated) {
      GemmContext::Impl::ensure(g.y, size_t(TN) * 4, stream);
      C = g.y.as<float>();
    } else if (p.residual) {
      if (p.residual != p.out)
        KVGRAPH_CUDA_CHECK(cudaMemcpyAsync(p.out, p.residual, size_t(TN) * 4, cudaMemcpyDeviceToDevice, stream));
      beta = 1.f;
    }
    const float alpha = 1.f;
    KVGRAPH_CUBLAS_CHECK(cublasSetStream(g.handle, stream));
    // cublasSetStream resets the workspace: set ours again (graph-safe).
    KVGRAPH_CUBLAS_CHECK(cublasSetWorkspace(g.handle, g.workspace.data(), g.workspace.bytes()));
    // Row-major out[T, N] = x[T, K] w[N, K]^T is column-major out^T = w^T x^T;
    // quantized weights go slab by slab of rows, each dequantised to bf16 first.
    const int rows = p.qbits ? slab_rows(p.N, p.K) : p.N;
    if (p.qbits) GemmContext::Impl::ensure(g.w_bf16, size_t(rows) * p.K * 2, stream);
    for (int n0 = 0; n0 < p.N; n0 += rows) {
      const int nr = std::min(rows, p.N - n0);
      const void* A = p.w;
      if (p.qbits) {
        const int64_t words = int64_t(nr) * p.K * p.qbits / 32;
        auto* slab = g.w_bf16.as<detail::bf16>();
        const auto* qw = static_cast<const uint32_t*>(p.w);
        const auto* sc = static_cast<const W*>(p.scales);
        const auto* bi = static_cast<const W*>(p.biases);
        if (p.qbits == 4)
          launch(dequant_rows_kernel<W, 4>, dim3(ceil_div(words, 256)), dim3(256), 0, stream, qw, sc, bi, p.group,
                 p.K, int64_t(n0), nr, slab);
        else
          launch(dequant_rows_kernel<W, 8>, dim3(ceil_div(words, 256)), dim3(256), 0, stream, qw, sc, bi, p.group,
                 p.K, int64_t(n0), nr, slab);
        A = slab;
      }
      KVGRAPH_CUBLAS_CHECK(cublasGemmEx(g.handle, CUBLAS_OP_T, CUBLAS_OP_N, nr, p.T, p.K, &alpha, A, ab_type, p.K, B,
                                        ab_type, p.K, &beta, C + n0, CUDA_R_32F, p.N, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
    }
    const W* bias = static_cast<const W*>(p.bias);
    if (gated) {
      launch(gate_kernel<W>, dim3(ceil_div(TN / 2, 256)), dim3(256), 0, stream, static_cast<const float*>(C), bias,
             p.out, p.T, p.N, p.act);
    } else if (bias) {
      launch(bias_kernel<W>, dim3(ceil_div(TN, 256)), dim3(256), 0, stream, p.out, bias, p.T, p.N);
    }
  });
}

}  // namespace kvgraph::cuda
