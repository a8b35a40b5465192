// CUDA linear on affine-quantized weights (MLX's "affine" layout, 4 and 8
// bits, groups of 32/64/128): the T == 1 fused-dequant GEMV in every launch
// shape, with the norm prologue and the bias / residual / gated epilogues,
// the multi-token GEMV (T <= kMaxGemvTokens) and the cuBLAS path (slabs
// dequantised to bf16), against a CPU
// reference that unpacks the words independently and dequantises each value
// as fmaf(scale, q, bias) in f32.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvgraph/dtype.h"
#include "kvgraph/error.h"
#include "kvgraph/tuning.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/qgemm.h"
#include "support/cuda_test_util.h"

namespace kvgraph::cuda {
namespace {

class CudaQuantLinear : public CudaDeviceTest {};

struct QWeights {
  int N, K, bits, group;
  std::vector<uint32_t> words;    // [N, K * bits / 32]
  std::vector<uint16_t> scales, biases;  // bf16 [N, K / group]
  std::vector<float> dense;       // [N, K] the values they stand for

  QWeights(int n, int k, int b, int g, uint32_t seed) : N(n), K(k), bits(b), group(g) {
    std::mt19937 rng(seed);
    const int levels = 1 << bits, per = 32 / bits;
    std::uniform_int_distribution<int> qd(0, levels - 1);
    std::normal_distribution<float> nd(0.f, 1.f);
    const float span = 2.f / std::sqrt(float(K));
    scales.resize(size_t(N) * K / group);
    biases.resize(scales.size());
    for (size_t i = 0; i < scales.size(); ++i) {
      scales[i] = f32_to_bf16(span / (levels - 1) * (0.5f + std::fabs(nd(rng))));
      biases[i] = f32_to_bf16(-0.5f * span + 0.1f * span * nd(rng));
    }
    std::vector<int> q(size_t(N) * K);
    for (auto& v : q) v = qd(rng);
    words.assign(size_t(N) * K / per, 0u);
    for (size_t i = 0; i < q.size(); ++i) words[i / per] |= uint32_t(q[i]) << ((i % per) * bits);
    dense.resize(q.size());
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < K; ++c) {
        // Unpacked again from the words, as a reader of the file would.
        const size_t i = size_t(r) * K + c;
        const uint32_t qv = (words[i / per] >> ((i % per) * bits)) & uint32_t(levels - 1);
        const size_t gi = size_t(r) * (K / group) + c / group;
        dense[i] = std::fmaf(bf16_to_f32(scales[gi]), float(qv), bf16_to_f32(biases[gi]));
      }
  }
};

enum class Epi { none, bias, residual, gated };

// Runs the product, checks it against the reference within tol and returns it.
std::vector<float> check(int T, int N, int K, int bits, int group, Epi epi, bool norm, GemvShape shape,
                         GemmContext* gemm, double tol, bool int8_x = false, bool qstream = true,
                         std::array<int, 3> ring = {0, 0, 0}, int qmma_tokens = LinearParams{}.qmma_tokens,
                         bool qblocks = false) {
  SCOPED_TRACE(testing::Message() << "T=" << T << " N=" << N << " K=" << K << " bits=" << bits << " group=" << group
                                  << " epi=" << int(epi) << " norm=" << norm << " shape=" << int(shape)
                                  << " int8_x=" << int8_x << " qstream=" << qstream << " ring=" << ring[0] << "x"
                                  << ring[1] << "x" << ring[2] << " qmma_tokens=" << qmma_tokens << " qblocks=" << qblocks);
  QWeights w(N, K, bits, group, 7 + N + K + bits);
  auto x = randn(size_t(T) * K, 11 + K);
  auto g = randn(K, 13 + K, 0.3f);
  auto bias = randn(N, 17 + N);
  auto res = randn(size_t(T) * N, 19 + N);
  const auto bias16 = bf16_of(bias);
  const auto dw = to_device(w.words), ds = to_device(w.scales), db = to_device(w.biases), dx = to_device(x),
             dg = to_device(g), dbias = to_device(bias16), dres = to_device(res);
  const size_t n_out = epi == Epi::gated ? size_t(T) * N / 2 : size_t(T) * N;
  DeviceBuffer out(n_out * 4);
  LinearParams p;
  p.x = dx.as<float>();
  p.w = dw.data();
  p.w_dtype = DType::BF16;
  p.qbits = bits;
  p.group = group;
  p.scales = ds.data();
  p.biases = db.data();
  p.bias = epi == Epi::bias || epi == Epi::gated ? dbias.data() : nullptr;
  p.residual = epi == Epi::residual ? dres.as<float>() : nullptr;
  p.out = out.as<float>();
  p.T = T;
  p.N = N;
  p.K = K;
  p.gated = epi == Epi::gated;
  p.shape = shape;
  p.int8_x = int8_x;
  p.qstream = qstream;
  p.qblocks = qblocks;
  p.qring_chunk = ring[0];
  p.qring_stages = ring[1];
  p.qring_blocks = ring[2];
  p.qmma_tokens = qmma_tokens;
  if (norm) p.norm = dg.as<float>();
  DeviceBuffer xprep(qblocks ? kQxScratchBytes : 16);
  p.xprep = qblocks ? xprep.data() : nullptr;
  linear(p, gemm, nullptr);
  const auto got = to_host<float>(out, n_out);

  // Reference: the product's view of x (normalised, and bf16-rounded with
  // bf16-rounded dense weights on the cuBLAS path), f64 accumulation.
  std::vector<float> xs = x, wd = w.dense;
  for (int t = 0; t < T && norm; ++t) {
    double ss = 0;
    for (int k = 0; k < K; ++k) ss += double(x[size_t(t) * K + k]) * x[size_t(t) * K + k];
    const double inv = 1.0 / std::sqrt(ss / K + 1e-6);
    for (int k = 0; k < K; ++k) xs[size_t(t) * K + k] = float(x[size_t(t) * K + k] * inv * g[k]);
  }
  if (T > kMaxGemvTokens) {
    for (auto& v : xs) v = bf16_to_f32(f32_to_bf16(v));
    for (auto& v : wd) v = bf16_to_f32(f32_to_bf16(v));
  }
  std::vector<float> y(size_t(T) * N), want(n_out);
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += double(xs[size_t(t) * K + k]) * wd[size_t(n) * K + k];
      if (p.bias) s += bf16_to_f32(bias16[n]);
      if (p.residual) s += res[size_t(t) * N + n];
      y[size_t(t) * N + n] = float(s);
    }
  for (size_t i = 0; i < n_out; ++i) {
    if (epi != Epi::gated) {
      want[i] = y[i];
      continue;
    }
    const size_t t = i / (N / 2), f = i % (N / 2);
    const double gt = y[t * N + 2 * f];
    want[i] = float(gt / (1.0 + std::exp(-gt)) * y[t * N + 2 * f + 1]);
  }
  EXPECT_LT(norm_err(got, want), tol);
  return got;
}

TEST_F(CudaQuantLinear, GemvMatchesDequantisedReferenceInEveryShape) {
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (GemvShape shape : {GemvShape::automatic, GemvShape::block2, GemvShape::warp2, GemvShape::warp4})
        for (bool norm : {false, true}) {
          check(1, 70, 384, bits, group, Epi::none, norm, shape, nullptr, 2e-5);
          check(1, 64, 4096, bits, group, Epi::bias, norm, shape, nullptr, 2e-5);
        }
}

TEST_F(CudaQuantLinear, GemvEpilogues) {
  for (int bits : {4, 8})
    for (Epi epi : {Epi::bias, Epi::residual, Epi::gated}) check(1, 96, 512, bits, 64, epi, true, GemvShape::automatic, nullptr, 2e-5);
}

// x quantized to int8 per weight vector in shared memory, DP4A products:
// within int8 rounding of x (absmax / 127 per vector) of the reference.
// Both kernels (linear.cu): qgemv_stream_kernel (weights staged through
// shared memory, the default where scales allow it) and qgemv_x8_kernel
// (registers; qstream off, and the streamed kernel's fallback).
TEST_F(CudaQuantLinear, Int8XGemvIsWithinInt8RoundingOfTheReference) {
  for (bool qstream : {true, false}) {
    for (int bits : {4, 8})
      for (int group : {32, 64, 128})
        for (bool norm : {false, true}) {
          check(1, 70, 384, bits, group, Epi::none, norm, GemvShape::automatic, nullptr, 1e-2, true, qstream);
          check(1, 64, 4096, bits, group, Epi::bias, norm, GemvShape::automatic, nullptr, 1e-2, true, qstream);
        }
    for (Epi epi : {Epi::residual, Epi::gated})
      check(1, 96, 512, 4, 64, epi, true, GemvShape::automatic, nullptr, 1e-2, true, qstream);
    // The launch shapes: 2200 rows of 384 (regs: a block per 32 rows, 2
    // vectors a row in flight); 8402 rows of 4096 (regs: one wave, 4 vectors
    // a row in flight; both: each warp streams several row groups, the last
    // partial).
    for (int bits : {4, 8}) {
      check(1, 2200, 384, bits, 64, Epi::none, true, GemvShape::automatic, nullptr, 1e-2, true, qstream);
      check(1, 8402, 4096, bits, 64, Epi::none, bits == 4, GemvShape::automatic, nullptr, 1e-2, true, qstream);
    }
  }
  // The streamed kernel's chunks of 128 code vectors: rows of 448 vectors
  // (int4, K = 14336: three full chunks and a half one), of 28 (K = 896: one
  // short chunk), an odd row count (the last pair's second row past N), and
  // K / group odd at group 128 with bf16 scales (K = 896: falls back to the
  // register kernel).
  for (int bits : {4, 8})
    for (int group : {64, 128}) {
      check(1, 1001, 896, bits, group, Epi::none, true, GemvShape::automatic, nullptr, 1e-2, true);
      check(1, 258, 14336, bits, group, Epi::residual, false, GemvShape::automatic, nullptr, 1e-2, true);
    }
}

// The small-block register kernel (qgemv=blocks): a thread's 1, 2 or 4
// vectors a row (K = 4096 int4 / int8: 128 / 256 vectors; 14336: 448 / 896;
// 896: 28 / 56 vectors, part of a warp idle; 384), rows past N (70, 1001,
// 258 rows: blocks of 8, 4 or 2 rows, the last partial), each group size
// (one group a vector or several), the norm prologue and every epilogue.
TEST_F(CudaQuantLinear, BlocksKernelIsWithinInt8RoundingOfTheReference) {
  const std::array<int, 3> ring = {0, 0, 0};
  const int qmma = LinearParams{}.qmma_tokens;
  for (int bits : {4, 8}) {
    for (int group : {32, 64, 128})
      for (bool norm : {false, true}) {
        check(1, 70, 384, bits, group, Epi::none, norm, GemvShape::automatic, nullptr, 1e-2, true, true, ring, qmma, true);
        check(1, 64, 4096, bits, group, Epi::bias, norm, GemvShape::automatic, nullptr, 1e-2, true, true, ring, qmma, true);
      }
    check(1, 1001, 896, bits, 64, Epi::none, true, GemvShape::automatic, nullptr, 1e-2, true, true, ring, qmma, true);
    check(1, 258, 14336, bits, 64, Epi::residual, true, GemvShape::automatic, nullptr, 1e-2, true, true, ring, qmma, true);
    check(1, 8402, 4096, bits, 128, Epi::bias, false, GemvShape::automatic, nullptr, 1e-2, true, true, ring, qmma, true);
    check(1, 96, 512, bits, 64, Epi::gated, true, GemvShape::automatic, nullptr, 1e-2, true, true, ring, qmma, true);
  }
}

// Every compiled ring of the streamed kernel (Tuning::kQRings), capped at one
// block an SM and uncapped: full and short chunks (K = 14336 int4: 448
// vectors, 3.5 chunks of 128, 7 of 64, 14 of 32; K = 896: one short chunk
// or less), an odd row count, several pairs a warp (8402 rows), each group
// size, the norm prologue (its 1 / rms applied to the row sums) and the
// epilogues.
TEST_F(CudaQuantLinear, EveryRingShapeIsWithinInt8RoundingOfTheReference) {
  for (const auto& cs : Tuning::kQRings)
    for (int cap : {0, 1}) {
      const std::array<int, 3> ring = {cs[0], cs[1], cap};
      for (int bits : {4, 8}) {
        for (int group : {32, 64, 128})
          check(1, 1001, 896, bits, group, Epi::none, group != 32, GemvShape::automatic, nullptr, 1e-2, true, true, ring);
        check(1, 258, 14336, bits, 64, Epi::residual, true, GemvShape::automatic, nullptr, 1e-2, true, true, ring);
        check(1, 8402, 4096, bits, 128, Epi::bias, false, GemvShape::automatic, nullptr, 1e-2, true, true, ring);
        check(1, 96, 512, bits, 64, Epi::gated, true, GemvShape::automatic, nullptr, 1e-2, true, true, ring);
      }
    }
}

TEST_F(CudaQuantLinear, MultiTokenGemvMatchesDequantisedReference) {
  // Each token's sums are those of a one-token GEMV: the T == 1 bound.
  for (int bits : {4, 8}) {
    check(2, 70, 384, bits, 32, Epi::none, false, GemvShape::automatic, nullptr, 2e-5);
    check(kMaxGemvTokens, 96, 512, bits, 64, Epi::gated, true, GemvShape::automatic, nullptr, 2e-5);
    check(5, 64, 4096, bits, 128, Epi::residual, false, GemvShape::automatic, nullptr, 2e-5);
  }
}

TEST_F(CudaQuantLinear, PrefillDequantisesSlabsForCublas) {
  GemmContext gemm;
  const int T = kMaxGemvTokens + 1;
  const auto slabs = GemvShape::automatic;
  for (int bits : {4, 8}) {
    check(T, 70, 384, bits, 32, Epi::none, false, slabs, &gemm, 1e-2, false, true, {0, 0, 0}, 0);
    check(T + 3, 96, 512, bits, 64, Epi::gated, true, slabs, &gemm, 1e-2, false, true, {0, 0, 0}, 0);
    check(16, 64, 1024, bits, 128, Epi::residual, false, slabs, &gemm, 1e-2, false, true, {0, 0, 0}, 0);
    // Shapes the fused kernel does not take go to the slabs by themselves:
    // K not a whole number of its stages of 64, more tokens than it takes
    // (by default, and at all).
    check(T, 40, 96, bits, 32, Epi::residual, true, slabs, &gemm, 1e-2);
    check(LinearParams{}.qmma_tokens + 1, 24, 128, bits, 32, Epi::bias, false, slabs, &gemm, 1e-2);
    check(kQGemmMaxTokens + 8, 24, 128, bits, 32, Epi::bias, false, slabs, &gemm, 1e-2, false, true, {0, 0, 0},
          kQGemmMaxTokens + 8);
    // More rows than one slab (32M values / K): N = 8400 at K = 4128 is two slabs.
    check(T, 8400, 4128, bits, 32, Epi::bias, false, slabs, &gemm, 1e-2);
  }
}

// The fused tensor-core kernel (qgemm.cu) against the reference, and against
// the slab path (cuBLAS on the same bf16 values: only the order of the f32
// sums differs), over partial token and row tiles, every epilogue, split and
// unsplit K; twice, bitwise the same.
TEST_F(CudaQuantLinear, PrefillFusedKernelMatchesTheSlabsAndTheReference) {
  GemmContext gemm;
  struct Case {
    int T, N, K, group;
    Epi epi;
    bool norm;
  };
  const Case cases[] = {
      {kMaxGemvTokens + 1, 70, 384, 32, Epi::none, false},  // one n-tile and a token, rows past N
      {64, 200, 512, 64, Epi::gated, true},                 // a whole token tile, gate, norm
      {65, 136, 1024, 128, Epi::residual, false},           // a second token tile of one token
      {130, 96, 4096, 64, Epi::bias, false},                // K split (a small grid), two 128-token tiles
      {300, 136, 1024, 64, Epi::gated, true},               // 128-token tiles, the last partial; gate, norm
      {512, 130, 2048, 32, Epi::residual, false},           // the longest step, rows past N
      {17, 4096, 2112, 32, Epi::residual, true},            // 33 stages: K not split; 32 row blocks
  };
  for (int bits : {4, 8})
    for (const Case& c : cases) {
      const auto fused = check(c.T, c.N, c.K, bits, c.group, c.epi, c.norm, GemvShape::automatic, &gemm, 1e-2,
                               false, true, {0, 0, 0}, kQGemmMaxTokens);
      const auto again = check(c.T, c.N, c.K, bits, c.group, c.epi, c.norm, GemvShape::automatic, &gemm, 1e-2,
                               false, true, {0, 0, 0}, kQGemmMaxTokens);
      const auto slabs = check(c.T, c.N, c.K, bits, c.group, c.epi, c.norm, GemvShape::automatic, &gemm, 1e-2,
                               false, true, {0, 0, 0}, 0);
      SCOPED_TRACE(testing::Message() << "T=" << c.T << " N=" << c.N << " K=" << c.K << " bits=" << bits);
      EXPECT_LT(norm_err(fused, slabs), 2e-5);
      ASSERT_EQ(fused.size(), again.size());
      EXPECT_EQ(std::memcmp(fused.data(), again.data(), fused.size() * 4), 0);
    }
}

TEST_F(CudaQuantLinear, RejectsBadFormats) {
  QWeights w(8, 64, 4, 32, 1);
  auto dw = to_device(w.words), ds = to_device(w.scales), dx = to_device(randn(64, 2));
  DeviceBuffer out(8 * 4);
  LinearParams p;
  p.x = dx.as<float>();
  p.w = dw.data();
  p.out = out.as<float>();
  p.N = 8;
  p.K = 64;
  p.qbits = 4;
  p.group = 32;
  p.scales = ds.data();
  p.biases = nullptr;  // missing biases
  EXPECT_THROW(linear(p, nullptr, nullptr), kvgraph::Error);
  p.biases = ds.data();
  p.qbits = 3;
  EXPECT_THROW(linear(p, nullptr, nullptr), kvgraph::Error);
  p.qbits = 4;
  p.group = 48;
  EXPECT_THROW(linear(p, nullptr, nullptr), kvgraph::Error);
  p.group = 128;  // K = 64 is not a multiple
  EXPECT_THROW(linear(p, nullptr, nullptr), kvgraph::Error);
}

}  // namespace
}  // namespace kvgraph::cuda
