// The product of a few rows (T <= kRowsMaxT): out[t, n] = dot(x[t], w[n]),
// computed for every (t, n) by the same chain of operations whatever T and
// N are. A decode step (T = 1) and a speculative verify step (T = K + 1)
// then give bitwise-equal rows, which is what makes greedy speculative
// decoding emit exactly the tokens plain decoding emits. BLAS does not
// promise that: sgemv and sgemm sum in different orders (measured with
// OpenBLAS 0.3.21: most of a row's values differ in the last bits), so small
// steps never go to BLAS.
//
// The chain for one (t, n): sixteen lane sums, lane j over k = j, j + 16,
// j + 32, ... in increasing k (a fused multiply-add each on AVX2+FMA
// machines, a multiply then an add elsewhere); lanes j and j + 8 added; then
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)); then the K % 16 tail in
// increasing k. The AVX2 path is chosen once per process from the CPU, so
// every step of a run uses the same chain.
//
// Speed (2-core AMD EPYC VM, one thread, best of 40): [1024, 256] T=1 20 us
// (OpenBLAS sgemv 16 us), T=5 75 us (sgemm 119 us); [4096, 256] 95 / 350 us
// (sgemv 71, sgemm 926). Two rows at a time, each token in turn: the rows
// stay in L1 while every token passes over them.
#include <cstdint>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ops/cpu/kernels.h"

namespace kvgraph::cpu {

namespace {

float tree8(const float* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

// ---- portable path: the chain above with a multiply then an add.

void rows_portable(const float* x, int T, const float* w, int N, int K, float* out, int64_t ldo) {
  const int K16 = K & ~15;
  for (int n = 0; n < N; ++n) {
    const float* wr = w + int64_t(n) * K;
    for (int t = 0; t < T; ++t) {
      const float* xr = x + int64_t(t) * K;
      float l[16] = {};
      for (int k = 0; k < K16; k += 16)
        for (int j = 0; j < 16; ++j) {
          const float p = wr[k + j] * xr[k + j];
          l[j] = l[j] + p;
        }
      float h[8];
      for (int j = 0; j < 8; ++j) h[j] = l[j] + l[j + 8];
      float s = tree8(h);
      for (int k = K16; k < K; ++k) {
        const float p = wr[k] * xr[k];
        s = s + p;
      }
      out[int64_t(t) * ldo + n] = s;
    }
  }
}

#if defined(__x86_64__)
// ---- AVX2 + FMA: R rows at a time; per (row, token) two 8-lane
// accumulators (the first and second half of each block of 16).

template <int R>
__attribute__((target("avx2,fma"))) inline void block(const float* x, const float* w, int n, int t, int K, float* out,
                                                      int64_t ldo) {
  const int K16 = K & ~15;
  const float* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = w + int64_t(n + r) * K;
  const float* xr = x + int64_t(t) * K;
  __m256 a[R], b[R];
  for (int r = 0; r < R; ++r) a[r] = b[r] = _mm256_setzero_ps();
  for (int k = 0; k < K16; k += 16) {
    const __m256 xa = _mm256_loadu_ps(xr + k), xb = _mm256_loadu_ps(xr + k + 8);
    for (int r = 0; r < R; ++r) {
      a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(wr[r] + k), xa, a[r]);
      b[r] = _mm256_fmadd_ps(_mm256_loadu_ps(wr[r] + k + 8), xb, b[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float h[8];
    _mm256_store_ps(h, _mm256_add_ps(a[r], b[r]));
    float s = tree8(h);
    for (int k = K16; k < K; ++k) s = __builtin_fmaf(wr[r][k], xr[k], s);
    out[int64_t(t) * ldo + n + r] = s;
  }
}

__attribute__((target("avx2,fma"))) void rows_avx2(const float* x, int T, const float* w, int N, int K, float* out,
                                                   int64_t ldo) {
  int n = 0;
  for (; n + 2 <= N; n += 2)
    for (int t = 0; t < T; ++t) block<2>(x, w, n, t, K, out, ldo);
  for (; n < N; ++n)
    for (int t = 0; t < T; ++t) block<1>(x, w, n, t, K, out, ldo);
}

bool use_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif

}  // namespace

void rows_product(const float* x, int T, const float* w, int N, int K, float* out, int64_t ldo) {
#if defined(__x86_64__)
  if (use_avx2()) return rows_avx2(x, T, w, N, K, out, ldo);
#endif
  rows_portable(x, T, w, N, K, out, ldo);
}

}  // namespace kvgraph::cpu
