// Quantized KV caches on the GPU (issue 15), model level: the CUDA graph
// replays the step over quantized pools bit for bit like eager decoding
// (captured once, rings wrapped many times), and the logits stay near the
// CPU's over the same formats. Labelled `gpu`; skips without a device.
// (Op level, every format against the CPU and the pool bytes:
// BackendOps.UpdateAndAttendQuantized.)
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "support/fixtures.h"
#include "support/logits.h"

using namespace kvgraph;
using namespace kvgraph::testing;

namespace {

const KvFormat kI8{KvType::Int8, 32}, kI4{KvType::Int4, 32}, kFp8{KvType::Fp8};

}  // namespace

// gemma3: flat and ring layers (window 12, pool 15), head_dim 32.
TEST(CudaKvQuant, GraphReplayIsBitwiseEqualToEagerForEveryFormat) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Reference ref = load_reference("gemma3");
  auto gpu = Model::load(fixtures_dir() / "gemma3", Device::CUDA);
  for (const KvStorage& st : {KvStorage{kI8}, KvStorage{kI4}, KvStorage{kFp8}, KvStorage{kI8, kI4}}) {
    for (bool legacy : {false, true}) {
      std::vector<int32_t> tokens[2];
      std::vector<float> logits[2];
      int captures = -1;
      for (int eager = 0; eager < 2; ++eager) {
        SessionOptions so{.capacity = 240, .max_write = 4, .kv_storage = st, .eager = eager == 1};
        if (legacy) so.tuning = Tuning::parse("attn=legacy");
        Session s(gpu, so);
        s.sampling() = ops::SamplingParams{0.9f, 20, 0.9f, 1.1f, 7};
        s.prefill(ref.greedy_prompt);
        tokens[eager].push_back(s.sample());
        for (int i = 0; i < 200; ++i) {
          tokens[eager].push_back(s.decode());
          const auto l = s.last_logits();
          logits[eager].insert(logits[eager].end(), l.begin(), l.end());
        }
        if (!eager) captures = s.captures();
      }
      const std::string what = kv_storage_name(st) + (legacy ? " legacy" : "");
      ASSERT_EQ(tokens[0], tokens[1]) << what;
      ASSERT_EQ(0, std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * 4)) << what;
      EXPECT_EQ(captures, 1) << what;
    }
  }
}

// The decode kernel over quantized pools merges its splits in a cluster's
// shared memory or through global memory with the same bits: a whole model
// (flat and ring layers), 16-key splits so a step has up to 15 of them; and
// with the L1 prefetch of the first tile (Tuning::attn_prefetch).
TEST(CudaKvQuant, ClusterAndGlobalSplitMergesGiveTheSameLogits) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Reference ref = load_reference("gemma3");
  auto gpu = Model::load(fixtures_dir() / "gemma3", Device::CUDA);
  for (const KvStorage& st : {KvStorage{kI8}, KvStorage{kI4}, KvStorage{kFp8}, KvStorage{kI8, kI4}}) {
    std::vector<float> logits[3];
    for (int global = 0; global < 3; ++global) {
      SessionOptions so{.capacity = 240, .max_write = 4, .kv_storage = st};
      so.tuning = Tuning::parse(global == 1   ? "attn-chunk=16,attn-merge=global"
                                : global == 2 ? "attn-chunk=16,attn-prefetch=on"
                                              : "attn-chunk=16");
      Session s(gpu, so);
      s.prefill(ref.greedy_prompt);
      s.sample();
      for (int i = 0; i < 150; ++i) {
        s.decode();
        const auto l = s.last_logits();
        logits[global].insert(logits[global].end(), l.begin(), l.end());
      }
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    EXPECT_EQ(0, std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * 4)) << kv_storage_name(st);
    ASSERT_EQ(logits[0].size(), logits[2].size());
    EXPECT_EQ(0, std::memcmp(logits[0].data(), logits[2].data(), logits[0].size() * 4))
        << kv_storage_name(st) << " with the prefetch";
  }
}

// Every prefill chunk (T = 4) and decode step (T = 1) of the same ids on
// both backends: the logits agree to within what one flipped code can do
// (the prologue's last bit differs between sincosf and std::sin).
TEST(CudaKvQuant, LogitsStayNearTheCpuOverTheSameFormat) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Reference ref = load_reference("gemma3");
  auto gpu = Model::load(fixtures_dir() / "gemma3", Device::CUDA);
  auto cpu = Model::load(fixtures_dir() / "gemma3", Device::CPU);
  for (const KvStorage& st : {KvStorage{kI8}, KvStorage{kI4}, KvStorage{kFp8}, KvStorage{kI8, kI4}}) {
    std::vector<float> out[2];
    for (int d = 0; d < 2; ++d) {
      SessionOptions so{.capacity = 200, .max_write = 4, .kv_storage = st};
      Session s(d == 0 ? cpu : gpu, so);
      s.prefill(ref.ids);
      out[d] = s.last_logits();
      for (int i = 0; i < 60; ++i) {
        s.prefill(std::vector<int32_t>{ref.ids[i % ref.ids.size()]});  // T = 1 steps, teacher-forced
        const auto l = s.last_logits();
        out[d].insert(out[d].end(), l.begin(), l.end());
      }
    }
    const double tol = st.v.type == KvType::Int4 ? 5e-2 : 2e-2;
    EXPECT_LT(normalized_error(out[1], out[0]), tol) << kv_storage_name(st);
  }
}
