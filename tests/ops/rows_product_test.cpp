// The CPU product of steps up to kRowsMaxT tokens (cpu::rows_product): row t
// of a T-token product is bitwise the one-token product of that row (what
// makes a speculative verify step's rows those of decode steps), for f32,
// bf16 and quantized weights and with every fused prologue and epilogue; and
// it is the matrix product, against a double-precision reference.
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "kvgraph/ops.h"
#include "kvgraph/quant.h"
#include "ops/cpu/kernels.h"

using namespace kvgraph;

namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

}  // namespace

// Every shape class: N and K not multiples of the blocking (odd rows, a K
// tail), T from 1 to kRowsMaxT.
TEST(RowsProduct, EveryRowIsTheOneTokenProductBitForBit) {
  for (auto [N, K] : {std::pair{1, 1}, {7, 5}, {33, 16}, {64, 100}, {130, 256}, {3, 1000}}) {
    const auto w = random_vector(size_t(N) * K, 1);
    const auto x = random_vector(size_t(cpu::kRowsMaxT) * K, 2);
    for (int T = 1; T <= cpu::kRowsMaxT; ++T) {
      std::vector<float> all(size_t(T) * N), one(N);
      cpu::rows_product(x.data(), T, w.data(), N, K, all.data(), N);
      for (int t = 0; t < T; ++t) {
        cpu::rows_product(x.data() + size_t(t) * K, 1, w.data(), N, K, one.data(), N);
        ASSERT_EQ(std::memcmp(one.data(), all.data() + size_t(t) * N, N * sizeof(float)), 0)
            << "N " << N << " K " << K << " T " << T << " row " << t;
        for (int n = 0; n < N; ++n) {
          double ref = 0;
          for (int k = 0; k < K; ++k) ref += double(w[size_t(n) * K + k]) * x[size_t(t) * K + k];
          ASSERT_NEAR(one[n], ref, 1e-5 * std::sqrt(double(K)) + 1e-6) << N << "x" << K << " n " << n;
        }
      }
    }
  }
}

// Through the op front: f32, bf16 and 4-bit weights, with the norm
// prologue, a bias and the gated or residual epilogue, row t of a T-token
// linear equals the same row alone.
TEST(RowsProduct, LinearStepsAreTokenInvariant) {
  Stream s(Device::CPU);
  const int N = 96, K = 128, T = 8;
  const auto wv = random_vector(size_t(N) * K, 3, 0.1f);
  const auto xv = random_vector(size_t(T) * K, 4);
  Tensor w32 = Tensor::from_host(wv.data(), {N, K}, DType::F32, Device::CPU);
  std::vector<uint16_t> wb(wv.size());
  for (size_t i = 0; i < wv.size(); ++i) wb[i] = f32_to_bf16(wv[i]);
  Tensor w16 = Tensor::from_host(wb.data(), {N, K}, DType::BF16, Device::CPU);
  Weight wq;  // 4-bit, groups of 32, f32 scales and biases
  {
    std::vector<uint32_t> words(size_t(N) * K / 8);
    std::vector<float> sc(size_t(N) * K / 32), bi(size_t(N) * K / 32);
    affine_quantize(wv.data(), N, K, 4, 32, words.data(), sc.data(), bi.data());
    wq.w = Tensor::from_host(words.data(), {N, K / 8}, DType::U32, Device::CPU);
    wq.scales = Tensor::from_host(sc.data(), {N, K / 32}, DType::F32, Device::CPU);
    wq.biases = Tensor::from_host(bi.data(), {N, K / 32}, DType::F32, Device::CPU);
    wq.format = {.bits = 4, .group = 32};
  }
  const auto nv = random_vector(K, 5);
  Tensor norm = Tensor::from_host(nv.data(), {K}, DType::F32, Device::CPU);
  const auto bv = random_vector(N, 6);
  Tensor bias = Tensor::from_host(bv.data(), {N}, DType::F32, Device::CPU);
  const auto rv = random_vector(size_t(T) * N, 7);
  Tensor x = Tensor::from_host(xv.data(), {T, K}, DType::F32, Device::CPU);

  for (const Weight& w : {Weight(w32), Weight(w16), wq}) {
    for (int mode = 0; mode < 3; ++mode) {  // plain + bias; norm + gated; norm + residual
      ops::LinearOptions o;
      if (mode == 0 && w.float_dtype() == DType::F32) o.bias = &bias;
      if (mode > 0) o.norm = &norm;
      o.gated = mode == 1;
      const int N_out = o.gated ? N / 2 : N;
      Tensor res = Tensor::from_host(rv.data(), {T, N}, DType::F32, Device::CPU);
      if (mode == 2) o.residual = &res;
      Tensor all = Tensor::zeros({T, N_out}, DType::F32, Device::CPU);
      ops::linear(s, x, w, all, o);
      const auto av = all.to_f32_vector();
      for (int t = 0; t < T; ++t) {
        Tensor xt = x.slice_rows(t, 1), rt = Tensor::from_host(rv.data() + size_t(t) * N, {1, N}, DType::F32, Device::CPU);
        ops::LinearOptions ot = o;
        if (mode == 2) ot.residual = &rt;
        Tensor one = Tensor::zeros({1, N_out}, DType::F32, Device::CPU);
        ops::linear(s, xt, w, one, ot);
        const auto ov = one.to_f32_vector();
        ASSERT_EQ(std::memcmp(ov.data(), av.data() + size_t(t) * N_out, N_out * sizeof(float)), 0)
            << dtype_name(w.w.dtype()) << " mode " << mode << " row " << t;
      }
    }
  }
}
