// The fused ops the decoder runs (norm prologue, gated and residual
// epilogues, packed-row RoPE / q-k norms / attention) on the CPU backend,
// against double-precision references and against the unfused ops.
#include <cmath>
#include <random>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvgraph/cache/sequence_cache.h"
#include "kvgraph/error.h"
#include "kvgraph/ops.h"

using namespace kvgraph;
using ::testing::HasSubstr;

namespace {

std::vector<float> random_vec(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor cpu_tensor(const std::vector<float>& v, std::vector<int64_t> shape) {
  return Tensor::from_host(v.data(), std::move(shape), DType::F32, Device::CPU);
}

// Packed rows [T, (Hq + 2 Hkv) * hd] as three tensors: q [T, Hq, hd], k and v [T, Hkv, hd].
struct SplitQkv {
  Tensor q, k, v;
};
SplitQkv split_qkv(const std::vector<float>& row, int T, int Hq, int Hkv, int hd) {
  const int W = (Hq + 2 * Hkv) * hd;
  std::vector<float> q, k, v;
  for (int t = 0; t < T; ++t) {
    const float* r = row.data() + t * W;
    q.insert(q.end(), r, r + Hq * hd);
    k.insert(k.end(), r + Hq * hd, r + (Hq + Hkv) * hd);
    v.insert(v.end(), r + (Hq + Hkv) * hd, r + W);
  }
  return {cpu_tensor(q, {T, Hq, hd}), cpu_tensor(k, {T, Hkv, hd}), cpu_tensor(v, {T, Hkv, hd})};
}

double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

std::vector<double> ref_norm(const float* x, const float* g, int K, double eps, bool plus_one) {
  double ss = 0;
  for (int k = 0; k < K; ++k) ss += double(x[k]) * x[k];
  const double r = 1.0 / std::sqrt(ss / K + eps);
  std::vector<double> h(K);
  for (int k = 0; k < K; ++k) h[k] = x[k] * r * (plus_one ? 1.0 + g[k] : double(g[k]));
  return h;
}

double ref_act(double g, Activation act) {
  if (act == Activation::SiLU) return g / (1.0 + std::exp(-g));
  return 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
}

struct LinearCase {
  int T, N, K;
  bool norm, plus_one, bias, residual, gated;
  Activation act;
};

// out = [norm] x @ w^T + bias, then gate or residual, in double.
std::vector<double> ref_linear(const LinearCase& c, const std::vector<float>& x, const std::vector<float>& w,
                               const std::vector<float>& b, const std::vector<float>& g,
                               const std::vector<float>& res) {
  const int n_out = c.gated ? c.N / 2 : c.N;
  std::vector<double> out(size_t(c.T) * n_out);
  for (int t = 0; t < c.T; ++t) {
    std::vector<double> h(x.begin() + size_t(t) * c.K, x.begin() + size_t(t + 1) * c.K);
    if (c.norm) h = ref_norm(x.data() + size_t(t) * c.K, g.data(), c.K, 1e-5, c.plus_one);
    std::vector<double> y(c.N);
    for (int n = 0; n < c.N; ++n) {
      double acc = c.bias ? b[n] : 0.0;
      for (int k = 0; k < c.K; ++k) acc += h[k] * w[size_t(n) * c.K + k];
      y[n] = acc;
    }
    for (int n = 0; n < n_out; ++n) {
      double v = c.gated ? ref_act(y[2 * n], c.act) * y[2 * n + 1] : y[n];
      if (c.residual) v += res[size_t(t) * n_out + n];
      out[size_t(t) * n_out + n] = v;
    }
  }
  return out;
}

TEST(FusedOps, LinearPrologueAndEpiloguesMatchDoubleReference) {
  const std::vector<LinearCase> cases = {
      {1, 24, 40, true, false, false, false, false, Activation::SiLU},
      {3, 24, 40, true, true, true, false, false, Activation::SiLU},
      {1, 16, 32, false, false, true, true, false, Activation::SiLU},
      {4, 16, 32, true, false, false, true, false, Activation::SiLU},
      {1, 32, 48, true, false, true, false, true, Activation::SiLU},
      {5, 32, 48, true, true, false, false, true, Activation::GeluTanh},
  };
  std::mt19937 rng(7);
  for (const LinearCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " N=" << c.N << " K=" << c.K << " norm=" << c.norm
                                      << " bias=" << c.bias << " residual=" << c.residual << " gated=" << c.gated);
    const int n_out = c.gated ? c.N / 2 : c.N;
    auto x = random_vec(size_t(c.T) * c.K, rng, -3.f, 3.f), w = random_vec(size_t(c.N) * c.K, rng);
    auto b = random_vec(c.N, rng), g = random_vec(c.K, rng, 0.5f, 1.5f), res = random_vec(size_t(c.T) * n_out, rng);
    const auto want = ref_linear(c, x, w, b, g, res);

    Stream s(Device::CPU);
    Tensor xt = cpu_tensor(x, {c.T, c.K}), wt = cpu_tensor(w, {c.N, c.K}), bt = cpu_tensor(b, {c.N});
    Tensor gt = cpu_tensor(g, {c.K});
    // The residual case writes into the residual itself (out aliases it), as the decoder does.
    Tensor out = c.residual ? cpu_tensor(res, {c.T, n_out}) : Tensor::zeros({c.T, n_out}, DType::F32, Device::CPU);
    ops::LinearOptions o;
    if (c.bias) o.bias = &bt;
    if (c.norm) {
      o.norm = &gt;
      o.norm_eps = 1e-5f;
      o.norm_plus_one = c.plus_one;
    }
    o.gated = c.gated;
    o.act = c.act;
    if (c.residual) o.residual = &out;
    ops::linear(s, xt, wt, out, o);
    EXPECT_LT(rel_err(out.to_f32_vector(), want), 1e-5);
    // x is an input only: the norm prologue must not normalise it in place.
    EXPECT_EQ(xt.to_f32_vector(), x);
  }
}

TEST(FusedOps, LinearRejectsBadFusions) {
  Stream s(Device::CPU);
  Tensor x = Tensor::zeros({1, 8}, DType::F32, Device::CPU), w = Tensor::zeros({6, 8}, DType::F32, Device::CPU);
  Tensor w_odd = Tensor::zeros({5, 8}, DType::F32, Device::CPU), out3 = Tensor::zeros({1, 3}, DType::F32, Device::CPU);
  Tensor out6 = Tensor::zeros({1, 6}, DType::F32, Device::CPU), g7 = Tensor::zeros({7}, DType::F32, Device::CPU);
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ops::LinearOptions gated;
  gated.gated = true;
  EXPECT_THAT(msg([&] { ops::linear(s, x, w_odd, out3, gated); }), HasSubstr("even N"));
  gated.residual = &out3;
  EXPECT_THAT(msg([&] { ops::linear(s, x, w, out3, gated); }), HasSubstr("no residual"));
  ops::LinearOptions bad_norm;
  bad_norm.norm = &g7;
  EXPECT_THAT(msg([&] { ops::linear(s, x, w, out6, bad_norm); }), HasSubstr("norm must be [8]"));
  EXPECT_THAT(msg([&] { ops::linear(s, x, w, out3, ops::LinearOptions{}); }), HasSubstr("out must be [1, 6]"));
}

TEST(FusedOps, RmsNormAddAccumulatesTheNormalisedRow) {
  std::mt19937 rng(3);
  const int rows = 3, D = 20;
  auto x = random_vec(rows * D, rng, -2.f, 2.f), g = random_vec(D, rng), acc = random_vec(rows * D, rng);
  std::vector<double> want(rows * D);
  for (int r = 0; r < rows; ++r) {
    auto h = ref_norm(x.data() + r * D, g.data(), D, 1e-6, true);
    for (int d = 0; d < D; ++d) want[r * D + d] = acc[r * D + d] + h[d];
  }
  Stream s(Device::CPU);
  Tensor xt = cpu_tensor(x, {rows, D}), gt = cpu_tensor(g, {D}), out = cpu_tensor(acc, {rows, D});
  ops::rms_norm_add(s, xt, gt, out, 1e-6f, true);
  EXPECT_LT(rel_err(out.to_f32_vector(), want), 1e-6);
}

// The cache's prologue (q/k RMSNorm, then RoPE) equals running the norm and
// RoPE ops first and attending without a prologue; the packed input is left
// as it was.
TEST(FusedOps, AttentionPrologueEqualsExplicitNormAndRope) {
  std::mt19937 rng(11);
  const int Hq = 4, Hkv = 2, hd = 8, W = (Hq + 2 * Hkv) * hd;
  auto gq = random_vec(hd, rng, 0.5f, 1.5f), gk = random_vec(hd, rng, 0.5f, 1.5f);
  std::vector<float> inv_freq(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / hd);
  Tensor qn = cpu_tensor(gq, {hd}), kn = cpu_tensor(gk, {hd}), freq = cpu_tensor(inv_freq, {hd / 2});
  CacheConfig cfg;
  cfg.storage = DType::F32;
  cfg.layers = {LayerSpec{Ring{4, 3}, Hq, Hkv, hd}};
  SequenceCache fused(cfg), explicit_ops(cfg);
  Stream s(Device::CPU);
  int32_t p = 0;
  for (int T : {3, 1, 1, 2, 1, 3, 1}) {
    Tensor pos = Tensor::from_host(&p, {1}, DType::I32, Device::CPU);
    auto row = random_vec(size_t(T) * W, rng, -2.f, 2.f);
    Tensor qkv = cpu_tensor(row, {T, W});
    auto [qt, kt, vt] = split_qkv(row, T, Hq, Hkv, hd);
    Tensor q_rows = qt.reshape({int64_t(T) * Hq, hd}), k_rows = kt.reshape({int64_t(T) * Hkv, hd});
    ops::rms_norm(s, q_rows, qn, q_rows, 1e-6f, true);
    ops::rms_norm(s, k_rows, kn, k_rows, 1e-6f, true);
    ops::rope(s, qt, pos, freq);
    ops::rope(s, kt, pos, freq);

    Tensor a = Tensor::zeros({T, Hq * hd}, DType::F32, Device::CPU);
    Tensor b = Tensor::zeros({T, Hq, hd}, DType::F32, Device::CPU);
    const CacheStep fused_step = fused.begin_step(s, pos, T);
    ops::update_and_attend(s, {.cache = &fused, .step = fused_step, .layer = 0, .qkv = &qkv, .out = &a,
                               .scale = 0.3f, .q_norm = &qn, .k_norm = &kn, .norm_eps = 1e-6f,
                               .norm_plus_one = true, .rope_inv_freq = &freq});
    const CacheStep explicit_step = explicit_ops.begin_step(s, pos, T);
    ops::update_and_attend(s, {.cache = &explicit_ops, .step = explicit_step, .layer = 0, .q = &qt, .k = &kt,
                               .v = &vt, .out = &b, .scale = 0.3f});
    ASSERT_EQ(a.to_f32_vector(), b.to_f32_vector()) << "at position " << p;
    ASSERT_EQ(qkv.to_f32_vector(), row) << "the prologue must not write its input";
    fused.commit(fused_step);
    explicit_ops.commit(explicit_step);
    p += T;
  }
  ASSERT_EQ(fused.k_pool(0).to_f32_vector(), explicit_ops.k_pool(0).to_f32_vector());
}

TEST(FusedOps, PackedUpdateAndAttendEqualsSeparateTensors) {
  std::mt19937 rng(5);
  const int Hq = 6, Hkv = 2, hd = 16, W = (Hq + 2 * Hkv) * hd;
  CacheConfig cfg;
  cfg.storage = DType::BF16;
  cfg.layers = {LayerSpec{Ring{5, 4}, Hq, Hkv, hd}, LayerSpec{Flat{32}, Hq, Hkv, hd}};
  SequenceCache packed_cache(cfg), split_cache(cfg);
  Stream s(Device::CPU);
  int32_t p = 0;
  Tensor pos = Tensor::from_host(&p, {1}, DType::I32, Device::CPU);
  for (int T : {4, 1, 3, 1, 4, 1}) {
    auto row = random_vec(size_t(T) * W, rng);
    Tensor qkv = cpu_tensor(row, {T, W});
    auto [qt, kt, vt] = split_qkv(row, T, Hq, Hkv, hd);
    const CacheStep packed_step = packed_cache.begin_step(s, pos, T);
    const CacheStep split_step = split_cache.begin_step(s, pos, T);
    for (int l = 0; l < 2; ++l) {
      Tensor a = Tensor::zeros({T, Hq * hd}, DType::F32, Device::CPU);
      Tensor b = Tensor::zeros({T, Hq, hd}, DType::F32, Device::CPU);
      ops::update_and_attend(s, {.cache = &packed_cache, .step = packed_step, .layer = l, .qkv = &qkv, .out = &a,
                                 .scale = 0.25f});
      ops::update_and_attend(s, {.cache = &split_cache, .step = split_step, .layer = l, .q = &qt, .k = &kt,
                                 .v = &vt, .out = &b, .scale = 0.25f});
      ASSERT_EQ(a.to_f32_vector(), b.to_f32_vector()) << "layer " << l << " at position " << p;
    }
    packed_cache.commit(packed_step);
    split_cache.commit(split_step);
    p += T;
    pos = Tensor::from_host(&p, {1}, DType::I32, Device::CPU);
  }
  Tensor wrong = Tensor::zeros({1, W - 1}, DType::F32, Device::CPU), out = Tensor::zeros({1, Hq * hd}, DType::F32, Device::CPU);
  const CacheStep step = packed_cache.begin_step(s, pos, 1);
  try {
    ops::update_and_attend(s, {.cache = &packed_cache, .step = step, .layer = 0, .qkv = &wrong, .out = &out});
    FAIL() << "no error for a short qkv row";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("qkv must be f32 [1, 160] on cpu"));
  }
}

// The op front checks update_and_attend's arguments before either backend
// sees them, naming the layer and the field.
TEST(FusedOps, UpdateAndAttendArgumentsAreCheckedByTheFront) {
  const int Hq = 4, Hkv = 2, hd = 8;
  CacheConfig cfg;
  cfg.layers = {LayerSpec{Flat{16}, Hq, Hkv, hd}};
  SequenceCache cache(cfg);
  Stream s(Device::CPU);
  Tensor pos = Tensor::zeros({1}, DType::I32, Device::CPU);
  Tensor qkv = Tensor::zeros({1, (Hq + 2 * Hkv) * hd}, DType::F32, Device::CPU);
  Tensor q = Tensor::zeros({1, Hq, hd}, DType::F32, Device::CPU);
  Tensor out = Tensor::zeros({1, Hq * hd}, DType::F32, Device::CPU);
  Tensor short_norm = Tensor::zeros({hd - 1}, DType::F32, Device::CPU);
  const CacheStep step = cache.begin_step(s, pos, 1);
  auto expect_error = [&](const ops::AttendArgs& a, const char* what) {
    try {
      ops::update_and_attend(s, a);
      ADD_FAILURE() << "no error, expected: " << what;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
  };
  expect_error({.cache = nullptr, .step = step, .qkv = &qkv, .out = &out}, "no cache given");
  expect_error({.cache = &cache, .step = CacheStep{}, .qkv = &qkv, .out = &out}, "call cache.begin_step first");
  expect_error({.cache = &cache, .step = step, .layer = 1, .qkv = &qkv, .out = &out}, "layer 1 out of range");
  expect_error({.cache = &cache, .step = step, .q = &q, .qkv = &qkv, .out = &out}, "either qkv or q, k and v");
  expect_error({.cache = &cache, .step = step, .q = &q, .out = &out}, "layer 0: k is missing");
  expect_error({.cache = &cache, .step = step, .qkv = &qkv, .out = &out, .q_norm = &short_norm},
               "q_norm must be f32 [8]");
  // Nothing was written: the pools are still zero.
  for (float x : cache.k_pool(0).to_f32_vector()) ASSERT_EQ(x, 0.f);
}

}  // namespace
