// CUDA token selection: argmax, masks and sampling. Sampling is checked draw
// for draw against the CPU backend's kvgraph::cpu::sample (same counter-based
// RNG, same walk order), which also proves determinism per (seed, pos).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cuda/kernels.h"
#include "support/cuda_test_util.h"

namespace kvgraph::cuda {
namespace {

class CudaSelect : public CudaDeviceTest {};

int32_t gpu_argmax(const std::vector<float>& logits, SelectWorkspace& ws) {
  auto d = to_device(logits);
  DeviceBuffer tok(4);
  argmax(d.as<float>(), int(logits.size()), tok.as<int32_t>(), ws, nullptr);
  return to_host<int32_t>(tok, 1)[0];
}

TEST_F(CudaSelect, ArgmaxPicksTheLowestIndexAmongMaxima) {
  SelectWorkspace ws;  // reused: every call must leave it clean
  auto l = randn(151936, 1);
  l[150000] = 100.f;
  EXPECT_EQ(gpu_argmax(l, ws), 150000);
  l[7000] = 100.f;
  EXPECT_EQ(gpu_argmax(l, ws), 7000);
  EXPECT_EQ(gpu_argmax(std::vector<float>(5, 1.0f), ws), 0);
  std::vector<float> ninf(262144, -std::numeric_limits<float>::infinity());
  ninf.back() = -1e30f;
  EXPECT_EQ(gpu_argmax(ninf, ws), 262143);
  auto neg = randn(1000, 2);
  for (auto& x : neg) x = -std::fabs(x) - 1.f;
  EXPECT_EQ(gpu_argmax(neg, ws), int(std::max_element(neg.begin(), neg.end()) - neg.begin()));
}

TEST_F(CudaSelect, MaskTokensAndMarkSeen) {
  const int V = 300;
  auto l = randn(V, 3);
  auto dl = to_device(l);
  auto ids = to_device(std::vector<int32_t>{5, 299, 7, 1000, -1});  // out of range ids are ignored
  mask_tokens(dl.as<float>(), V, ids.as<int32_t>(), 5, nullptr);
  auto got = to_host<float>(dl, V);
  for (int i = 0; i < V; ++i) {
    if (i == 5 || i == 299 || i == 7)
      EXPECT_EQ(got[i], -std::numeric_limits<float>::infinity());
    else
      EXPECT_EQ(got[i], l[i]);
  }
  DeviceBuffer seen(V);
  seen.zero();
  mark_seen(ids.as<int32_t>(), 5, seen.as<uint8_t>(), V, nullptr);
  auto s = to_host<uint8_t>(seen, V);
  for (int i = 0; i < V; ++i) EXPECT_EQ(s[i], (i == 5 || i == 299 || i == 7) ? 1 : 0);
}

// Runs `draws` samples at positions pos0, pos0+1, ... on the device (the
// position advanced on the device between draws) and on the CPU backend, with
// the same seen-token bookkeeping. Returns the fraction of equal draws.
double agreement(const std::vector<float>& logits, const ops::SamplingParams& sp, std::vector<int32_t> banned,
                 bool use_seen, int draws, std::vector<int32_t>* gpu_tokens = nullptr) {
  const int V = int(logits.size());
  SamplingConfig cfg;
  cfg.temperature = sp.temperature;
  cfg.top_k = sp.top_k;
  cfg.top_p = sp.top_p;
  cfg.repetition_penalty = sp.repetition_penalty;
  cfg.seed = sp.seed;
  auto dcfg = to_device(std::vector<SamplingConfig>{cfg});
  auto dl = to_device(logits);
  auto dban = to_device(banned.empty() ? std::vector<int32_t>{0} : banned);
  std::vector<uint8_t> seen(V, 0);
  for (int i = 0; i < V; i += 7) seen[i] = 1;  // some history
  auto dseen = to_device(seen);
  auto dpos = to_device(std::vector<int32_t>{1000});
  DeviceBuffer tok(4);
  SelectWorkspace ws;
  SampleParams p;
  p.logits = dl.as<float>();
  p.V = V;
  p.config = dcfg.as<SamplingConfig>();
  p.banned = banned.empty() ? nullptr : dban.as<int32_t>();
  p.n_banned = int(banned.size());
  p.seen = use_seen ? dseen.as<uint8_t>() : nullptr;
  p.pos = dpos.as<int32_t>();
  p.token = tok.as<int32_t>();
  int same = 0, reported = 0;
  for (int i = 0; i < draws; ++i) {
    sample(p, ws, nullptr);
    advance_position(dpos.as<int32_t>(), 1, nullptr);
    const int32_t g = to_host<int32_t>(tok, 1)[0];
    const int32_t c = cpu::sample(logits.data(), V, sp, banned.data(), int(banned.size()),
                                  use_seen ? seen.data() : nullptr, 1000 + i);
    same += g == c;
    if (gpu_tokens) gpu_tokens->push_back(g);
    if (g != c && reported++ < 3) std::printf("[sample] draw %d differs: gpu %d, cpu %d\n", i, g, c);
    if (use_seen) seen[g] = 1;  // the kernel marked the GPU's choice; mirror it
    if (use_seen) EXPECT_EQ(to_host<uint8_t>(dseen, V)[g], 1);
  }
  return double(same) / draws;
}

TEST_F(CudaSelect, GreedySampleHonoursBansAndRepetitionPenalty) {
  auto l = randn(5000, 4, 2.f);
  ops::SamplingParams sp;  // temperature 0: greedy
  sp.repetition_penalty = 1.5f;
  EXPECT_EQ(agreement(l, sp, {}, false, 3), 1.0);
  EXPECT_EQ(agreement(l, sp, {}, true, 3), 1.0);
  const int best = int(std::max_element(l.begin(), l.end()) - l.begin());
  std::vector<int32_t> tokens;
  EXPECT_EQ(agreement(l, sp, {best, 3}, false, 2, &tokens), 1.0);
  EXPECT_NE(tokens[0], best);
}

TEST_F(CudaSelect, SampleMatchesTheCpuBackendDrawForDraw) {
  auto l = randn(2000, 5, 3.f);
  struct Cfg {
    float t;
    int k;
    float p;
    float pen;
    bool seen;
  };
  for (Cfg c : {Cfg{1.0f, 0, 1.0f, 1.0f, false}, Cfg{0.7f, 50, 1.0f, 1.0f, false}, Cfg{1.0f, 0, 0.9f, 1.0f, false},
                Cfg{1.3f, 40, 0.8f, 1.0f, false}, Cfg{0.9f, 0, 0.95f, 1.3f, true}, Cfg{2.0f, 1, 1.0f, 1.0f, false}}) {
    ops::SamplingParams sp;
    sp.temperature = c.t;
    sp.top_k = c.k;
    sp.top_p = c.p;
    sp.repetition_penalty = c.pen;
    sp.seed = 1234;
    const double a = agreement(l, sp, {17}, c.seen, 300);
    EXPECT_GE(a, 0.99) << "t=" << c.t << " k=" << c.k << " p=" << c.p << " pen=" << c.pen;
  }
}

TEST_F(CudaSelect, UniformLogitsPickTheTokenAtTheDrawsRank) {
  ops::SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 99;
  // The CPU rounds u * sum to f32, so a draw within an ulp of a boundary may differ.
  EXPECT_GE(agreement(std::vector<float>(1000, 0.f), sp, {}, false, 200), 0.99);
  sp.top_k = 10;  // all tied: top-k keeps the ten lowest ids, as the CPU does
  std::vector<int32_t> toks;
  EXPECT_GE(agreement(std::vector<float>(1000, 0.f), sp, {}, false, 100, &toks), 0.99);
  for (int t : toks) EXPECT_LT(t, 10);
  sp.top_k = 0;
  sp.top_p = 0.0051f;  // 5.1 tokens' worth of mass: the six lowest ids
  toks.clear();
  EXPECT_GE(agreement(std::vector<float>(1000, 0.f), sp, {}, false, 100, &toks), 0.99);
  for (int t : toks) EXPECT_LT(t, 6);
}

TEST_F(CudaSelect, TopKAndTopPKeepOnlyTheNucleus) {
  std::vector<float> l(50000, -5.f);
  for (int i = 0; i < 8; ++i) l[1000 * i + 3] = 10.f - i;  // 8 strong candidates
  ops::SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 3;
  sp.seed = 5;
  std::vector<int32_t> toks;
  agreement(l, sp, {}, false, 200, &toks);
  for (int t : toks) EXPECT_TRUE(t == 3 || t == 1003 || t == 2003) << t;
  sp.top_k = 0;
  sp.top_p = 0.5f;  // the top token alone holds ~63%
  toks.clear();
  agreement(l, sp, {}, false, 50, &toks);
  for (int t : toks) EXPECT_EQ(t, 3);
}

TEST_F(CudaSelect, CapturedSampleStepIsDeterministicPerSeedAndPosition) {
  const int V = 262144;  // Gemma-sized vocabulary: several blocks in the max pass
  auto l = randn(V, 6, 2.f);
  SamplingConfig cfg;
  cfg.temperature = 0.8f;
  cfg.top_k = 64;
  cfg.top_p = 0.95f;
  cfg.seed = 42;
  auto dcfg = to_device(std::vector<SamplingConfig>{cfg});
  auto dl = to_device(l);
  auto run = [&](bool graph) {
    auto dpos = to_device(std::vector<int32_t>{0});
    DeviceBuffer tok(4);
    SelectWorkspace ws;
    SampleParams p;
    p.logits = dl.as<float>();
    p.V = V;
    p.config = dcfg.as<SamplingConfig>();
    p.pos = dpos.as<int32_t>();
    p.token = tok.as<int32_t>();
    CudaStream s;
    CudaGraph g;
    if (graph) {
      g.begin_capture(s.get());
      sample(p, ws, s.get());
      advance_position(dpos.as<int32_t>(), 1, s.get());
      g.end_capture();
    }
    std::vector<int32_t> out;
    for (int i = 0; i < 40; ++i) {
      if (graph) {
        g.launch(s.get());
      } else {
        sample(p, ws, s.get());
        advance_position(dpos.as<int32_t>(), 1, s.get());
      }
      s.synchronize();
      out.push_back(to_host<int32_t>(tok, 1)[0]);
    }
    return out;
  };
  const auto eager = run(false), replayed = run(true);
  EXPECT_EQ(eager, replayed);
  int distinct = int(std::set<int32_t>(eager.begin(), eager.end()).size());
  EXPECT_GT(distinct, 3);  // the position feeds the RNG
  ops::SamplingParams sp;
  sp.temperature = cfg.temperature;
  sp.top_k = cfg.top_k;
  sp.top_p = cfg.top_p;
  sp.seed = cfg.seed;
  int same = 0;
  for (int i = 0; i < 40; ++i) same += cpu::sample(l.data(), V, sp, nullptr, 0, nullptr, i) == eager[i];
  EXPECT_GE(same, 39);
}

}  // namespace
}  // namespace kvgraph::cuda
