// CUDA linear: the T == 1 GEMV (vector and scalar paths, bias, residual,
// gated epilogue, graph capture) and the multi-token GEMV (T <= kMaxGemvTokens) and the cuBLAS path, against a CPU
// loop, each also with the RMSNorm prologue. (The GEMV's bandwidth on decode
// shapes is a benchmark: bench/kernels/kernel_bench.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kvgraph/dtype.h"
#include "ops/cuda/kernels.h"
#include "support/cuda_test_util.h"

namespace kvgraph::cuda {
namespace {

class CudaLinear : public CudaDeviceTest {};

struct Weights {
  std::vector<float> ref;  // the values the device holds, as f32
  DeviceBuffer dev;
  Weights(const std::vector<float>& w, DType dt) {
    if (dt == DType::BF16) {
      std::vector<uint16_t> b(w.size());
      ref.resize(w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        b[i] = f32_to_bf16(w[i]);
        ref[i] = bf16_to_f32(b[i]);
      }
      dev = to_device(b);
    } else {
      ref = w;
      dev = to_device(w);
    }
  }
};

enum class Epi { none, bias, residual, residual_in_place, bias_and_residual, silu, gelu };
enum class Gate { none, silu, gelu_tanh };

// The T == 1 launch shape check_linear / check_norm_linear ask for.
GemvShape g_shape = GemvShape::automatic;

void set_gate(LinearParams& p, Gate gate) {
  p.gated = gate != Gate::none;
  p.act = gate == Gate::gelu_tanh ? Activation::GeluTanh : Activation::SiLU;
}

float ref_act(float g, Gate gate) {
  if (gate == Gate::silu) return float(g / (1.0 + std::exp(-double(g))));
  const double k = 0.7978845608028654;
  return float(0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * double(g) * g * g))));
}

// x [T, K] (the values as the GEMM sees them), w [N, K] -> out per `epi`.
std::vector<float> ref_linear(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* bias,
                              const std::vector<float>* residual, Gate gate, int T, int N, int K) {
  std::vector<float> y(size_t(T) * N);
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += double(x[size_t(t) * K + k]) * w[size_t(n) * K + k];
      if (bias) s += (*bias)[n];
      if (residual) s += (*residual)[size_t(t) * N + n];
      y[size_t(t) * N + n] = float(s);
    }
  if (gate == Gate::none) return y;
  std::vector<float> o(size_t(T) * N / 2);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < N / 2; ++i)
      o[size_t(t) * N / 2 + i] = ref_act(y[size_t(t) * N + 2 * i], gate) * y[size_t(t) * N + 2 * i + 1];
  return o;
}

void check_linear(int T, int N, int K, DType dt, Epi epi, GemmContext* gemm, double tol) {
  SCOPED_TRACE(testing::Message() << "T=" << T << " N=" << N << " K=" << K << " w=" << dtype_name(dt)
                                  << " epi=" << int(epi));
  auto x = randn(size_t(T) * K, 1 + N + K);
  Weights w(randn(size_t(N) * K, 2 + N, 1.0f / std::sqrt(float(K))), dt);
  Weights b(randn(N, 3 + N), dt);
  auto res = randn(size_t(T) * N, 4 + N);
  const Gate gate = epi == Epi::silu ? Gate::silu : epi == Epi::gelu ? Gate::gelu_tanh : Gate::none;
  const bool has_bias = epi == Epi::bias || epi == Epi::bias_and_residual || gate != Gate::none;
  const bool has_res = epi == Epi::residual || epi == Epi::residual_in_place || epi == Epi::bias_and_residual;
  const size_t n_out = gate != Gate::none ? size_t(T) * N / 2 : size_t(T) * N;

  auto dx = to_device(x), dres = to_device(res);
  DeviceBuffer out(n_out * 4);
  LinearParams p;
  p.x = dx.as<float>();
  p.w = w.dev.data();
  p.w_dtype = dt;
  p.bias = has_bias ? b.dev.data() : nullptr;
  p.residual = has_res ? dres.as<float>() : nullptr;
  p.out = epi == Epi::residual_in_place ? dres.as<float>() : out.as<float>();
  p.T = T;
  p.N = N;
  p.K = K;
  set_gate(p, gate);
  p.shape = g_shape;
  linear(p, gemm, nullptr);
  auto got = to_host<float>(epi == Epi::residual_in_place ? dres : out, n_out);

  // The cuBLAS path (T > kMaxGemvTokens) with bf16 weights rounds x to bf16
  // before the GEMM; the GEMV keeps x in f32.
  std::vector<float> xr = x;
  if (T > kMaxGemvTokens && dt == DType::BF16)
    for (auto& v : xr) v = bf16_to_f32(f32_to_bf16(v));
  auto want = ref_linear(xr, w.ref, has_bias ? &b.ref : nullptr, has_res ? &res : nullptr, gate, T, N, K);
  EXPECT_LT(norm_err(got, want), tol);
}

TEST_F(CudaLinear, GemvMatchesCpuOnVectorAndScalarPaths) {
  // (N, K): short rows (warp per pair), long rows (block per pair), odd N, K
  // not a multiple of the vector width (scalar fallback), long K.
  const int shapes[][2] = {{64, 64}, {130, 896}, {256, 2048}, {97, 4096}, {33, 1000}, {8, 1003}, {50, 14336}, {3, 8}};
  for (DType dt : {DType::F32, DType::BF16})
    for (auto& s : shapes) check_linear(1, s[0], s[1], dt, Epi::none, nullptr, 1e-4);
}

TEST_F(CudaLinear, GemvEpilogues) {
  for (DType dt : {DType::F32, DType::BF16})
    for (Epi e : {Epi::bias, Epi::residual, Epi::residual_in_place, Epi::bias_and_residual, Epi::silu, Epi::gelu}) {
      check_linear(1, 128, 2048, dt, e, nullptr, 1e-4);
      check_linear(1, 46, 896, dt, e, nullptr, 1e-4);
      check_linear(1, 10, 36, dt, e, nullptr, 1e-4);  // scalar path for bf16 (36 % 8 != 0)
    }
}

TEST_F(CudaLinear, MultiTokenGemvAndCublasMatchCpu) {
  GemmContext gemm;
  // 2 and 7: the multi-token GEMV; 9 and 64: cuBLAS.
  for (int T : {2, 7, kMaxGemvTokens + 1, 64})
    for (Epi e : {Epi::none, Epi::bias, Epi::residual, Epi::residual_in_place, Epi::silu}) {
      check_linear(T, 96, 256, DType::F32, e, &gemm, 1e-4);
      // bf16: where the path rounds x to bf16 the reference does too, so only accumulation differs.
      check_linear(T, 96, 256, DType::BF16, e, &gemm, 1e-3);
      check_linear(T, 200, 1000, DType::BF16, e, &gemm, 1e-3);
    }
}

TEST_F(CudaLinear, GemvIsDeterministicAndCapturable) {
  const int N = 1024, K = 2048;
  auto x = randn(K, 5);
  Weights w(randn(size_t(N) * K, 6), DType::BF16);
  auto dx = to_device(x);
  DeviceBuffer out(N * 4), out2(N * 4);
  LinearParams p;
  p.x = dx.as<float>();
  p.w = w.dev.data();
  p.w_dtype = DType::BF16;
  p.out = out.as<float>();
  p.N = N;
  p.K = K;
  linear(p, nullptr, nullptr);
  auto eager = to_host<float>(out, N);

  CudaStream s;
  CudaGraph g;
  p.out = out2.as<float>();
  g.begin_capture(s.get());
  linear(p, nullptr, s.get());
  g.end_capture();
  for (int i = 0; i < 3; ++i) {
    g.launch(s.get());
    s.synchronize();
    EXPECT_EQ(to_host<float>(out2, N), eager);
  }
}

// ---------------------------------------------------------------- RMSNorm prologue

// h [T, K] = rms_norm(x) in double: x * rsqrt(mean(x^2) + eps) * g, g = norm or 1 + norm.
std::vector<float> ref_rms_norm(const std::vector<float>& x, const std::vector<float>& norm, float eps,
                                bool plus_one, int T, int K) {
  std::vector<float> h(size_t(T) * K);
  for (int t = 0; t < T; ++t) {
    const float* xr = &x[size_t(t) * K];
    double ss = 0;
    for (int k = 0; k < K; ++k) ss += double(xr[k]) * xr[k];
    const double inv = 1.0 / std::sqrt(ss / K + double(eps));
    for (int k = 0; k < K; ++k) {
      const double g = plus_one ? 1.0 + double(norm[k]) : double(norm[k]);
      h[size_t(t) * K + k] = float(double(xr[k]) * inv * g);
    }
  }
  return h;
}

// linear with p.norm set vs rms_norm-then-linear on the CPU. norm_offset = 1
// passes a norm pointer that is not 16-byte aligned (T == 1: scalar path).
void check_norm_linear(int T, int N, int K, DType dt, Epi epi, bool plus_one, GemmContext* gemm, double tol,
                       int norm_offset = 0) {
  SCOPED_TRACE(testing::Message() << "T=" << T << " N=" << N << " K=" << K << " w=" << dtype_name(dt)
                                  << " epi=" << int(epi) << " plus_one=" << plus_one
                                  << " norm_offset=" << norm_offset);
  // Not unit scale, so a missing or wrong normalisation shows.
  auto x = randn(size_t(T) * K, 11 + N + K, 3.0f);
  auto norm = randn(size_t(K) + norm_offset, 12 + K, 0.3f);
  if (!plus_one)
    for (auto& v : norm) v += 1.0f;
  const std::vector<float> norm_used(norm.begin() + norm_offset, norm.end());
  Weights w(randn(size_t(N) * K, 13 + N, 1.0f / std::sqrt(float(K))), dt);
  Weights b(randn(N, 14 + N), dt);
  auto res = randn(size_t(T) * N, 15 + N);
  const Gate gate = epi == Epi::silu ? Gate::silu : epi == Epi::gelu ? Gate::gelu_tanh : Gate::none;
  const bool has_bias = epi == Epi::bias || epi == Epi::bias_and_residual || gate != Gate::none;
  const bool has_res = epi == Epi::residual || epi == Epi::residual_in_place || epi == Epi::bias_and_residual;
  const size_t n_out = gate != Gate::none ? size_t(T) * N / 2 : size_t(T) * N;
  const float eps = 1e-5f;

  auto dx = to_device(x), dres = to_device(res), dnorm = to_device(norm);
  DeviceBuffer out(n_out * 4);
  LinearParams p;
  p.x = dx.as<float>();
  p.w = w.dev.data();
  p.w_dtype = dt;
  p.bias = has_bias ? b.dev.data() : nullptr;
  p.residual = has_res ? dres.as<float>() : nullptr;
  p.out = epi == Epi::residual_in_place ? dres.as<float>() : out.as<float>();
  p.T = T;
  p.N = N;
  p.K = K;
  set_gate(p, gate);
  p.shape = g_shape;
  p.norm = dnorm.as<float>() + norm_offset;
  p.norm_eps = eps;
  p.norm_plus_one = plus_one;
  linear(p, gemm, nullptr);
  auto got = to_host<float>(epi == Epi::residual_in_place ? dres : out, n_out);
  EXPECT_EQ(to_host<float>(dx, x.size()), x) << "x was modified";

  // The cuBLAS path (T > kMaxGemvTokens) with bf16 weights rounds the
  // normalised rows to bf16 before the GEMM; the GEMV keeps them in f32.
  auto h = ref_rms_norm(x, norm_used, eps, plus_one, T, K);
  if (T > kMaxGemvTokens && dt == DType::BF16) h = bf16_round(h);
  auto want = ref_linear(h, w.ref, has_bias ? &b.ref : nullptr, has_res ? &res : nullptr, gate, T, N, K);
  EXPECT_LT(norm_err(got, want), tol);
}

TEST_F(CudaLinear, GemvNormPrologueMatchesCpu) {
  // (N, K): warp per pair (896), block per pair (2048), scalar fallback (30:
  // not a multiple of the vector width), odd N on a short row.
  const int shapes[][2] = {{46, 896}, {128, 2048}, {10, 30}, {33, 1000}};
  for (DType dt : {DType::F32, DType::BF16})
    for (bool plus_one : {false, true}) {
      for (auto& s : shapes) check_norm_linear(1, s[0], s[1], dt, Epi::none, plus_one, nullptr, 1e-4);
      for (Epi e : {Epi::bias, Epi::residual, Epi::residual_in_place, Epi::bias_and_residual, Epi::silu, Epi::gelu}) {
        check_norm_linear(1, 46, 896, dt, e, plus_one, nullptr, 1e-4);
        check_norm_linear(1, 128, 2048, dt, e, plus_one, nullptr, 1e-4);
        check_norm_linear(1, 10, 30, dt, e, plus_one, nullptr, 1e-4);
      }
      // A norm pointer that is not 16-byte aligned takes the scalar path.
      check_norm_linear(1, 64, 2048, dt, Epi::bias_and_residual, plus_one, nullptr, 1e-4, 1);
    }
}

// Every T == 1 launch shape (a block or a warp per row pair, a warp per four
// rows) computes the same function: odd N, rows not a multiple of four, every
// epilogue, with and without the norm prologue.
TEST_F(CudaLinear, EveryGemvLaunchShapeMatchesCpu) {
  for (GemvShape shape : {GemvShape::block2, GemvShape::warp2, GemvShape::warp4}) {
    g_shape = shape;
    for (DType dt : {DType::F32, DType::BF16}) {
      for (int N : {33, 46, 130}) check_linear(1, N, 896, dt, Epi::none, nullptr, 1e-4);
      for (Epi e : {Epi::bias, Epi::residual_in_place, Epi::bias_and_residual, Epi::silu, Epi::gelu}) {
        check_linear(1, 46, 2048, dt, e, nullptr, 1e-4);
        check_norm_linear(1, 46, 2048, dt, e, true, nullptr, 1e-4);
        check_norm_linear(1, 102, 896, dt, e, false, nullptr, 1e-4);
      }
    }
  }
  g_shape = GemvShape::automatic;
}

// The tensor-core GEMV (bf16 weights; f32 weights fall back to the default
// shapes) serves every T <= kMaxGemvTokens: odd N, rows not a multiple of 8
// or 16, K not a multiple of its 32-value chunks (1000), every epilogue,
// with and without the norm prologue, against the f64 CPU loop.
TEST_F(CudaLinear, MmaGemvMatchesCpuForEveryTokenCount) {
  for (GemvShape shape : {GemvShape::mma, GemvShape::mma8, GemvShape::mma16, GemvShape::mmax}) {
    g_shape = shape;
    for (int T : {1, 2, 5, kMaxGemvTokens}) {
      for (int N : {33, 46, 130}) {
        check_linear(T, N, 896, DType::BF16, Epi::none, nullptr, 1e-4);
        check_linear(T, N, 1000, DType::BF16, Epi::none, nullptr, 1e-4);
      }
      check_linear(T, 46, 896, DType::F32, Epi::bias, nullptr, 1e-4);
      for (Epi e : {Epi::bias, Epi::residual_in_place, Epi::bias_and_residual, Epi::silu, Epi::gelu}) {
        check_linear(T, 46, 2048, DType::BF16, e, nullptr, 1e-4);
        check_norm_linear(T, 46, 2048, DType::BF16, e, true, nullptr, 1e-4);
        check_norm_linear(T, 102, 1000, DType::BF16, e, false, nullptr, 1e-4);
      }
    }
  }
  g_shape = GemvShape::automatic;
}

TEST_F(CudaLinear, PrefillNormPrologueMatchesCpu) {
  GemmContext gemm;
  for (bool plus_one : {false, true})
    for (Epi e : {Epi::none, Epi::bias, Epi::residual, Epi::residual_in_place, Epi::silu, Epi::gelu}) {
      // 5: the multi-token GEMV; 12: cuBLAS.
      for (int T : {5, kMaxGemvTokens + 4})
        for (int K : {30, 896, 2048}) {
          check_norm_linear(T, 96, K, DType::F32, e, plus_one, &gemm, 1e-4);
          // bf16: where the path rounds the normalised x to bf16, so does the reference.
          check_norm_linear(T, 96, K, DType::BF16, e, plus_one, &gemm, 1e-3);
        }
      check_norm_linear(2, 200, 1000, DType::BF16, e, plus_one, &gemm, 1e-3);
    }
}

// The T > 1 norm scratch comes from reserve(), so a prefill step with the
// prologue can be captured (ensure() refuses to allocate during capture).
TEST_F(CudaLinear, PrefillNormPrologueIsCapturableAfterReserve) {
  const int T = kMaxGemvTokens + 4, N = 96, K = 896;  // the cuBLAS path
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    GemmContext gemm;
    gemm.reserve(T, K);
    auto x = randn(size_t(T) * K, 21, 2.0f);
    auto norm = randn(K, 22, 0.3f);
    Weights w(randn(size_t(N) * K, 23, 1.0f / std::sqrt(float(K))), dt);
    auto dx = to_device(x), dnorm = to_device(norm);
    DeviceBuffer out(size_t(T) * N * 4);
    LinearParams p;
    p.x = dx.as<float>();
    p.w = w.dev.data();
    p.w_dtype = dt;
    p.out = out.as<float>();
    p.T = T;
    p.N = N;
    p.K = K;
    p.norm = dnorm.as<float>();
    p.norm_plus_one = true;

    CudaStream s;
    linear(p, &gemm, s.get());  // warm-up (module loading, cuBLAS setup) outside the capture
    s.synchronize();
    out.zero();
    CudaGraph g;
    g.begin_capture(s.get());
    linear(p, &gemm, s.get());
    g.end_capture();
    g.launch(s.get());
    s.synchronize();
    auto h = ref_rms_norm(x, norm, p.norm_eps, true, T, K);
    if (dt == DType::BF16) h = bf16_round(h);
    auto want = ref_linear(h, w.ref, nullptr, nullptr, Gate::none, T, N, K);
    EXPECT_LT(norm_err(to_host<float>(out, size_t(T) * N), want), dt == DType::BF16 ? 1e-3 : 1e-4);
  }
}

// The prologue's reductions (sum of squares and dot products) run in a fixed
// order: two eager runs and graph replays agree bit for bit, on every GEMV variant.
TEST_F(CudaLinear, GemvNormPrologueIsDeterministic) {
  const int shapes[][2] = {{1024, 2048}, {512, 896}, {64, 30}};
  for (DType dt : {DType::F32, DType::BF16})
    for (auto& sh : shapes) {
      const int N = sh[0], K = sh[1];
      SCOPED_TRACE(testing::Message() << "N=" << N << " K=" << K << " w=" << dtype_name(dt));
      auto x = randn(K, 31 + K, 2.0f);
      auto norm = randn(K, 32 + K, 0.3f);
      Weights w(randn(size_t(N) * K, 33 + N, 1.0f / std::sqrt(float(K))), dt);
      Weights b(randn(N, 34 + N), dt);
      auto dx = to_device(x), dnorm = to_device(norm);
      DeviceBuffer out(size_t(N) * 4), out2(size_t(N) * 4);
      LinearParams p;
      p.x = dx.as<float>();
      p.w = w.dev.data();
      p.w_dtype = dt;
      p.bias = b.dev.data();
      p.out = out.as<float>();
      p.N = N;
      p.K = K;
      p.norm = dnorm.as<float>();
      p.norm_plus_one = true;
      linear(p, nullptr, nullptr);
      auto first = to_host<float>(out, N);
      p.out = out2.as<float>();
      linear(p, nullptr, nullptr);
      EXPECT_EQ(to_host<float>(out2, N), first);

      CudaStream s;
      CudaGraph g;
      out2.zero();
      g.begin_capture(s.get());
      linear(p, nullptr, s.get());
      g.end_capture();
      for (int i = 0; i < 2; ++i) {
        g.launch(s.get());
        s.synchronize();
        EXPECT_EQ(to_host<float>(out2, N), first);
      }
    }
}

}  // namespace
}  // namespace kvgraph::cuda
