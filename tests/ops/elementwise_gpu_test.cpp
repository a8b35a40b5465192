// CUDA elementwise ops (embedding, rms_norm, rope, act_mul, add, softcap,
// scale, advance_position) and the runtime helpers (graphs, bandwidth probes),
// each against a plain CPU loop written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kvgraph/dtype.h"
#include "ops/cuda/kernels.h"
#include "support/cuda_test_util.h"

namespace kvgraph::cuda {
namespace {

class CudaElementwise : public CudaDeviceTest {};

// Weights as the device sees them: the bf16 copy (rounded) or the f32 one.
struct Weights {
  std::vector<float> ref;  // values the reference uses
  DeviceBuffer dev;
  DType dtype;
  Weights(const std::vector<float>& w, DType dt) : dtype(dt) {
    if (dt == DType::BF16) {
      ref = bf16_round(w);
      dev = to_device(bf16_of(w));
    } else {
      ref = w;
      dev = to_device(w);
    }
  }
};

TEST_F(CudaElementwise, EmbeddingGathersScaledRowsAndZeroesBadIds) {
  const int V = 100, D = 72, T = 6;
  for (DType dt : {DType::F32, DType::BF16}) {
    Weights table(randn(size_t(V) * D, 1), dt);
    std::vector<int32_t> ids = {0, 99, 5, 5, 42, 100};  // 100 is out of range
    auto d_ids = to_device(ids);
    DeviceBuffer out(size_t(T) * D * 4);
    embedding(table.dev.data(), dt, V, d_ids.as<int32_t>(), T, D, 1.5f, out.as<float>(), nullptr);
    auto got = to_host<float>(out, size_t(T) * D);
    for (int t = 0; t < T; ++t)
      for (int d = 0; d < D; ++d) {
        const float want = ids[t] < V ? table.ref[size_t(ids[t]) * D + d] * 1.5f : 0.f;
        ASSERT_EQ(got[size_t(t) * D + d], want) << "t=" << t << " d=" << d;
      }
  }
}

std::vector<float> ref_rms_norm(const std::vector<float>& x, const std::vector<float>& w, int rows, int D, float eps,
                                bool plus_one) {
  std::vector<float> o(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int d = 0; d < D; ++d) ss += double(x[size_t(r) * D + d]) * x[size_t(r) * D + d];
    const double inv = 1.0 / std::sqrt(ss / D + eps);
    for (int d = 0; d < D; ++d)
      o[size_t(r) * D + d] = float(x[size_t(r) * D + d] * inv * (plus_one ? 1.0 + w[d] : w[d]));
  }
  return o;
}

TEST_F(CudaElementwise, RmsNormMatchesCpu) {
  for (int D : {16, 64, 896, 2048, 4099, 8192})
    for (int rows : {1, 3})
      for (DType dt : {DType::F32, DType::BF16})
        for (bool plus_one : {false, true}) {
          auto x = randn(size_t(rows) * D, 2, 3.0f);
          Weights w(randn(D, 3, 0.5f), dt);
          auto dx = to_device(x);
          DeviceBuffer out(x.size() * 4);
          rms_norm(dx.as<float>(), w.dev.data(), dt, out.as<float>(), rows, D, 1e-6f, plus_one, nullptr);
          auto got = to_host<float>(out, x.size());
          EXPECT_LT(norm_err(got, ref_rms_norm(x, w.ref, rows, D, 1e-6f, plus_one)), 1e-5)
              << "D=" << D << " rows=" << rows << " plus_one=" << plus_one;
          // In place.
          rms_norm(dx.as<float>(), w.dev.data(), dt, dx.as<float>(), rows, D, 1e-6f, plus_one, nullptr);
          EXPECT_EQ(to_host<float>(dx, x.size()), got);
        }
}

TEST_F(CudaElementwise, RmsNormPerHeadOnAStridedFusedQkvRow) {
  // Rows of a fused qkv buffer [T, (Hq + 2 Hkv) * hd]: normalise the Hq q heads.
  const int T = 3, Hq = 4, Hkv = 2, hd = 64, row = (Hq + 2 * Hkv) * hd;
  auto x = randn(size_t(T) * row, 4);
  Weights w(randn(hd, 5), DType::BF16);
  auto dx = to_device(x);
  RmsNormParams p;
  p.x = dx.as<float>();
  p.out = dx.as<float>();
  p.weight = w.dev.data();
  p.weight_dtype = DType::BF16;
  p.tokens = T;
  p.heads = Hq;
  p.dim = hd;
  p.x_stride = row;
  p.out_stride = row;
  p.plus_one = true;
  rms_norm(p, nullptr);
  auto got = to_host<float>(dx, x.size());
  std::vector<float> want = x;
  for (int t = 0; t < T; ++t) {
    std::vector<float> heads(x.begin() + size_t(t) * row, x.begin() + size_t(t) * row + Hq * hd);
    auto n = ref_rms_norm(heads, w.ref, Hq, hd, 1e-6f, true);
    std::copy(n.begin(), n.end(), want.begin() + size_t(t) * row);
  }
  EXPECT_LT(norm_err(got, want), 1e-5);
  // The k and v parts are untouched.
  for (int t = 0; t < T; ++t)
    for (int i = Hq * hd; i < row; ++i) ASSERT_EQ(got[size_t(t) * row + i], x[size_t(t) * row + i]);
}

TEST_F(CudaElementwise, AddRmsNormUpdatesResidualAndNormalises) {
  const int rows = 2, D = 2048;
  auto res = randn(size_t(rows) * D, 6), delta = randn(size_t(rows) * D, 7);
  Weights w(randn(D, 8), DType::BF16);
  auto dres = to_device(res), ddelta = to_device(delta);
  DeviceBuffer out(res.size() * 4);
  add_rms_norm(dres.as<float>(), ddelta.as<float>(), w.dev.data(), DType::BF16, out.as<float>(), rows, D, 1e-5f,
               false, nullptr);
  std::vector<float> sum(res.size());
  for (size_t i = 0; i < res.size(); ++i) sum[i] = res[i] + delta[i];
  EXPECT_EQ(to_host<float>(dres, res.size()), sum);
  EXPECT_LT(norm_err(to_host<float>(out, res.size()), ref_rms_norm(sum, w.ref, rows, D, 1e-5f, false)), 1e-5);
}

std::vector<float> inv_freq_of(int hd, float theta) {
  std::vector<float> f(hd / 2);
  for (int i = 0; i < hd / 2; ++i) f[i] = float(1.0 / std::pow(double(theta), 2.0 * i / hd));
  return f;
}

// HF rotate-half RoPE: f32 angle, cos/sin of that f32 angle (here in double).
void ref_rope(std::vector<float>& x, int32_t pos0, const std::vector<float>& inv_freq, int T, int H, int hd,
              int64_t row_stride) {
  const int half = hd / 2;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < half; ++i) {
        const float ang = float(pos0 + t) * inv_freq[i];
        const double c = std::cos(double(ang)), s = std::sin(double(ang));
        float* v = x.data() + t * row_stride + size_t(h) * hd;
        const double a = v[i], b = v[i + half];
        v[i] = float(a * c - b * s);
        v[i + half] = float(b * c + a * s);
      }
}

TEST_F(CudaElementwise, RopeReadsPositionFromDeviceAndMatchesHf) {
  for (int hd : {16, 64, 128, 256})
    for (int32_t pos0 : {0, 7, 1000, 131000}) {
      const int T = 5, H = 3;
      auto x = randn(size_t(T) * H * hd, 9);
      auto inv = inv_freq_of(hd, 500000.f);
      auto dx = to_device(x), dinv = to_device(inv), dpos = to_device(std::vector<int32_t>{pos0});
      rope(dx.as<float>(), dpos.as<int32_t>(), dinv.as<float>(), T, H, hd, nullptr);
      auto want = x;
      ref_rope(want, pos0, inv, T, H, hd, int64_t(H) * hd);
      EXPECT_LT(norm_err(to_host<float>(dx, x.size()), want), 2e-6) << "hd=" << hd << " pos=" << pos0;
    }
}

TEST_F(CudaElementwise, RopeRotatesQAndKHeadsOfAFusedRowOnly) {
  const int T = 4, Hq = 14, Hkv = 2, hd = 64, row = (Hq + 2 * Hkv) * hd;
  auto x = randn(size_t(T) * row, 10);
  auto inv = inv_freq_of(hd, 10000.f);
  auto dx = to_device(x), dinv = to_device(inv), dpos = to_device(std::vector<int32_t>{33});
  RopeParams p;
  p.x = dx.as<float>();
  p.pos = dpos.as<int32_t>();
  p.inv_freq = dinv.as<float>();
  p.T = T;
  p.n_heads = Hq + Hkv;
  p.head_dim = hd;
  p.row_stride = row;
  rope(p, nullptr);
  auto want = x;
  ref_rope(want, 33, inv, T, Hq + Hkv, hd, row);
  auto got = to_host<float>(dx, x.size());
  EXPECT_LT(norm_err(got, want), 2e-6);
  for (int t = 0; t < T; ++t)  // v untouched
    for (int i = (Hq + Hkv) * hd; i < row; ++i) ASSERT_EQ(got[size_t(t) * row + i], x[size_t(t) * row + i]);
}

float ref_act(float g, Activation act) {
  if (act == Activation::SiLU) return float(g / (1.0 + std::exp(-double(g))));
  const double k = 0.7978845608028654;
  return float(0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * double(g) * g * g))));
}

TEST_F(CudaElementwise, ActMulSeparateAndFusedLayouts) {
  const int T = 3, F = 1000;
  for (Activation act : {Activation::SiLU, Activation::GeluTanh}) {
    auto g = randn(size_t(T) * F, 11, 3.f), u = randn(size_t(T) * F, 12);
    std::vector<float> want(size_t(T) * F), gu(size_t(T) * 2 * F);
    for (int t = 0; t < T; ++t)
      for (int f = 0; f < F; ++f) {
        want[size_t(t) * F + f] = ref_act(g[size_t(t) * F + f], act) * u[size_t(t) * F + f];
        gu[size_t(t) * 2 * F + f] = g[size_t(t) * F + f];
        gu[size_t(t) * 2 * F + F + f] = u[size_t(t) * F + f];
      }
    auto dg = to_device(g), du = to_device(u), dgu = to_device(gu);
    DeviceBuffer out(want.size() * 4), out2(want.size() * 4);
    act_mul(dg.as<float>(), du.as<float>(), out.as<float>(), T, F, act, nullptr);
    act_mul_fused(dgu.as<float>(), out2.as<float>(), T, F, act, nullptr);
    EXPECT_LT(norm_err(to_host<float>(out, want.size()), want), 1e-6);
    EXPECT_LT(norm_err(to_host<float>(out2, want.size()), want), 1e-6);
  }
}

TEST_F(CudaElementwise, AddSoftcapScale) {
  const int n = 5000;
  auto a = randn(n, 13, 40.f), b = randn(n, 14);
  auto da = to_device(a), db = to_device(b);
  DeviceBuffer out(n * 4);
  add(da.as<float>(), db.as<float>(), out.as<float>(), n, nullptr);
  auto s = to_host<float>(out, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(s[i], a[i] + b[i]);
  softcap(da.as<float>(), n, 30.f, nullptr);
  std::vector<float> want(n);
  for (int i = 0; i < n; ++i) want[i] = float(30.0 * std::tanh(a[i] / 30.0));
  EXPECT_LT(norm_err(to_host<float>(da, n), want), 1e-6);
  scale(db.as<float>(), n, 0.25f, nullptr);
  auto sc = to_host<float>(db, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(sc[i], b[i] * 0.25f);
}

TEST_F(CudaElementwise, AdvancePositionAddsOnTheDevice) {
  auto pos = to_device(std::vector<int32_t>{5});
  advance_position(pos.as<int32_t>(), 3, nullptr);
  advance_position(pos.as<int32_t>(), 1, nullptr);
  EXPECT_EQ(to_host<int32_t>(pos, 1)[0], 9);
}

// A captured rope + advance replays at the position in device memory, never
// the one current at capture time.
TEST_F(CudaElementwise, GraphReplayReadsTheAdvancingPosition) {
  const int H = 2, hd = 64, n = H * hd;
  auto inv = inv_freq_of(hd, 10000.f);
  auto dinv = to_device(inv), dpos = to_device(std::vector<int32_t>{10});
  DeviceBuffer dx(n * 4);
  CudaStream s;
  CudaGraph g;
  g.begin_capture(s.get());
  rope(dx.as<float>(), dpos.as<int32_t>(), dinv.as<float>(), 1, H, hd, s.get());
  advance_position(dpos.as<int32_t>(), 1, s.get());
  g.end_capture();
  EXPECT_GE(g.node_count(), 2u);
  for (int step = 0; step < 6; ++step) {
    auto x = randn(n, 100 + step);
    dx.upload(x.data(), n * 4);
    g.launch(s.get());
    s.synchronize();
    auto want = x;
    ref_rope(want, 10 + step, inv, 1, H, hd, n);
    EXPECT_LT(norm_err(to_host<float>(dx, n), want), 2e-6) << "replay " << step;
  }
  EXPECT_EQ(to_host<int32_t>(dpos, 1)[0], 16);
}

}  // namespace
}  // namespace kvgraph::cuda
