// Regression probes for the T=1 GPU path: where eager T=1 prefill first
// diverges from the CPU, with and without programmatic dependent launch, and
// the T=1 pieces (GEMV on f32 weights with short rows, attention over a
// growing flat history) one at a time.
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "kvgraph/cache/sequence_cache.h"
#include "kvgraph/model.h"
#include "kvgraph/ops.h"
#include "kvgraph/session.h"
#include "ops/cpu/kernels.h"
#include "ops/cuda/kernels.h"
#include "support/fixtures.h"

using namespace kvgraph;
using namespace kvgraph::testing;

namespace {

int first_divergence(std::shared_ptr<const Model> gpu, std::shared_ptr<const Model> cpu, const std::vector<int32_t>& ids,
                     bool pdl, double* worst) {
  auto run = [&](std::shared_ptr<const Model> m) {
    SessionOptions so;
    so.tuning.programmatic_launch = pdl;
    so.capacity = static_cast<int32_t>(ids.size());
    so.max_write = 1;
    so.all_logits = true;
    Session s(std::move(m), so);
    std::vector<std::vector<float>> rows;
    s.prefill(ids, [&](int32_t, int32_t, const std::vector<float>& l) { rows.push_back(l); });
    return rows;
  };
  auto g = run(gpu), c = run(cpu);
  *worst = 0;
  int first = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    double w = 0;
    for (size_t j = 0; j < g[i].size(); ++j) w = std::max(w, std::abs(double(g[i][j]) - c[i][j]));
    if (w > 1e-3 && first < 0) first = static_cast<int>(i);
    *worst = std::max(*worst, w);
  }
  return first;
}

}  // namespace

TEST(CudaChunk1, FirstDivergingPositionWithAndWithoutPdl) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& fam : fixture_families()) {
    const Reference ref = load_reference(fam);
    auto gpu = Model::load(fixtures_dir() / fam, Device::CUDA);
    auto cpu = Model::load(fixtures_dir() / fam, Device::CPU);
    for (bool pdl : {true, false}) {
      double worst = 0;
      int first = first_divergence(gpu, cpu, ref.ids, pdl, &worst);
      std::printf("[probe] %-8s pdl=%d first_divergence=%d worst=%g\n", fam.c_str(), pdl, first, worst);
      EXPECT_EQ(first, -1) << fam << " pdl=" << pdl;
    }
  }
}

TEST(CudaChunk1, GemvOnShortF32RowsMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Stream s(Device::CUDA);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-1, 1);
  for (int K : {16, 32, 64, 128}) {
    for (int N : {16, 64, 128, 256}) {
      std::vector<float> w(size_t(N) * K), x(K), b(N), ref(N);
      for (auto& v : w) v = d(rng);
      for (auto& v : x) v = d(rng);
      for (auto& v : b) v = d(rng);
      cpu::linear(x.data(), w.data(), b.data(), ref.data(), 1, N, K);
      Tensor tw = Tensor::from_host(w.data(), {N, K}, DType::F32, Device::CUDA);
      Tensor tx = Tensor::from_host(x.data(), {1, K}, DType::F32, Device::CUDA);
      Tensor tb = Tensor::from_host(b.data(), {N}, DType::F32, Device::CUDA);
      Tensor to = Tensor::zeros({1, N}, DType::F32, Device::CUDA);
      ops::linear(s, tx, tw, &tb, to);
      s.synchronize();
      auto got = to.to_f32_vector();
      double err = 0;
      for (int i = 0; i < N; ++i) err = std::max(err, std::abs(double(got[i]) - ref[i]));
      EXPECT_LT(err, 1e-4) << "K=" << K << " N=" << N;
    }
  }
}

TEST(CudaChunk1, DecodeAttentionOverGrowingFlatHistoryMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (int D : {16, 32, 64}) {
    const int Hq = 4, Hkv = 2, cap = 64;
    CacheConfig cc{{LayerSpec{Flat{cap}, Hq, Hkv, D}}, DType::F32, Device::CPU};
    SequenceCache ccpu(cc);
    cc.device = Device::CUDA;
    SequenceCache cgpu(cc);
    Stream sc(Device::CPU), sg(Device::CUDA);
    Tensor pc = Tensor::zeros({1}, DType::I32, Device::CPU), pg = Tensor::zeros({1}, DType::I32, Device::CUDA);
    std::mt19937 rng(9);
    std::normal_distribution<float> nd;
    for (int p = 0; p < 40; ++p) {
      std::vector<float> q(Hq * D), k(Hkv * D), v(Hkv * D);
      for (auto& x : q) x = nd(rng);
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      pc.copy_from_host(&p);
      pg.copy_from_host(&p);
      std::vector<float> outc, outg;
      for (int dev = 0; dev < 2; ++dev) {
        Device dv = dev ? Device::CUDA : Device::CPU;
        Stream& s = dev ? sg : sc;
        SequenceCache& c = dev ? cgpu : ccpu;
        Tensor tq = Tensor::from_host(q.data(), {1, Hq, D}, DType::F32, dv);
        Tensor tk = Tensor::from_host(k.data(), {1, Hkv, D}, DType::F32, dv);
        Tensor tv = Tensor::from_host(v.data(), {1, Hkv, D}, DType::F32, dv);
        Tensor to = Tensor::zeros({1, Hq, D}, DType::F32, dv);
        const CacheStep step = c.begin_step(s, dev ? pg : pc, 1);
        ops::update_and_attend(s, {.cache = &c, .step = step, .layer = 0, .q = &tq, .k = &tk, .v = &tv, .out = &to,
                                   .scale = 0.3f});
        s.synchronize();
        c.commit(step);
        (dev ? outg : outc) = to.to_f32_vector();
      }
      double err = 0;
      for (size_t i = 0; i < outc.size(); ++i) err = std::max(err, std::abs(double(outg[i]) - outc[i]));
      ASSERT_LT(err, 1e-4) << "D=" << D << " position " << p;
    }
  }
}
