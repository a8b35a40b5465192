// Compiled (recorded once, replayed per token) and eager decode must agree
// bit for bit, for every family and cache policy; the recorded step must
// read its position from the step state, never from record time.
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "support/decode_trace.h"
#include "support/fixtures.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;

class CompiledDecode : public ::testing::TestWithParam<std::string> {};

// 216 decode steps; fixture windows are 8-16, so ring layers (pool =
// window + max_write - 1) wrap many times. Families cover flat-only
// (llama, qwen3), ring-only (mistral) and mixed (qwen2, gemma2, gemma3).
TEST_P(CompiledDecode, BitwiseEqualToEagerOverManyStepsGreedyAndSampled) {
  auto model = Model::load(fixtures_dir() / GetParam(), Device::CPU);
  const Reference ref = load_reference(GetParam());
  SessionOptions so;
  so.capacity = 240;
  so.max_write = 4;
  for (ops::SamplingParams sp : {ops::SamplingParams{}, ops::SamplingParams{0.9f, 20, 0.9f, 1.1f, 7}}) {
    int captures = 0;
    so.eager = true;
    Trace eager = decode_trace(model, so, ref.greedy_prompt, 216, sp);
    so.eager = false;
    Trace compiled = decode_trace(model, so, ref.greedy_prompt, 216, sp, &captures);
    expect_bitwise(eager, compiled, GetParam());
    EXPECT_EQ(captures, 1) << "the decode step must be recorded once per session";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CompiledDecode, ::testing::ValuesIn(fixture_families()),
                         [](const auto& info) { return info.param; });

TEST(CompiledDecodeState, RecordedAtOnePositionReplaysCorrectlyAtAnother) {
  // Record at position 16 (the first decode), then move the sequence: reset
  // and prefill a prompt of another length, and trim back within the ring
  // rule. The same recording must follow the position in the step state; a
  // step that froze 16 would write and read the wrong slots and diverge.
  auto model = Model::load(fixtures_dir() / "gemma3", Device::CPU);
  const Reference ref = load_reference("gemma3");
  SessionOptions so;
  so.capacity = 200;
  so.max_write = 4;
  Session compiled(model, so);
  so.eager = true;
  Session eager(model, so);
  std::vector<std::vector<int32_t>> tokens(2);
  std::vector<std::vector<float>> last(2);
  int k = 0;
  for (Session* s : {&compiled, &eager}) {
    auto& out = tokens[k];
    s->prefill(ref.greedy_prompt);
    s->sample();
    for (int i = 0; i < 20; ++i) s->decode();  // recorded at position 16
    s->reset();
    std::vector<int32_t> other(ref.ids.begin() + 3, ref.ids.begin() + 40);  // 37 tokens
    s->prefill(other);
    out.push_back(s->sample());
    for (int i = 0; i < 60; ++i) out.push_back(s->decode());
    s->trim(s->position() - 3);  // within max_write: allowed for the ring layers
    s->prefill(std::vector<int32_t>{ref.ids[50], ref.ids[51]});
    out.push_back(s->sample());
    for (int i = 0; i < 30; ++i) out.push_back(s->decode());
    last[k] = s->last_logits();
    ++k;
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  EXPECT_EQ(0, std::memcmp(last[0].data(), last[1].data(), last[0].size() * sizeof(float)));
  EXPECT_EQ(compiled.captures(), 1);
  EXPECT_EQ(eager.captures(), 0);
}

TEST(CompiledDecodeState, FullCacheRaisesBeforeWritingAndLeavesCacheUnchanged) {
  auto model = Model::load(fixtures_dir() / "llama", Device::CPU);
  const Reference ref = load_reference("llama");
  for (bool eager : {false, true}) {
    SessionOptions so;
    so.capacity = 24;
    so.max_write = 4;
    so.eager = eager;
    Session s(model, so);
    s.prefill(ref.greedy_prompt);  // 16
    s.sample();
    while (s.position() < 24) s.decode();
    std::vector<std::vector<float>> before;
    for (int l = 0; l < s.cache().n_layers(); ++l) {
      before.push_back(s.cache().k_pool(l).to_f32_vector());
      before.push_back(s.cache().v_pool(l).to_f32_vector());
    }
    try {
      s.decode();
      FAIL() << "expected a full-cache error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("cache is full: 24 of 24"));
    }
    EXPECT_EQ(s.position(), 24);
    for (int l = 0; l < s.cache().n_layers(); ++l) {
      EXPECT_EQ(before[2 * l], s.cache().k_pool(l).to_f32_vector());
      EXPECT_EQ(before[2 * l + 1], s.cache().v_pool(l).to_f32_vector());
    }
    // A prompt that does not fit is refused before anything is written too.
    s.reset();
    EXPECT_THROW(s.prefill(std::vector<int32_t>(25, 5)), Error);
    EXPECT_EQ(s.position(), 0);
  }
}

TEST(CompiledDecodeState, RecordedStepReadsNoHostPositionCpuTapeHasFixedLength) {
  // The tape is recorded once; its length does not grow with tokens.
  auto model = Model::load(fixtures_dir() / "qwen2", Device::CPU);
  const Reference ref = load_reference("qwen2");
  SessionOptions so;
  so.capacity = 64;
  Session s(model, so);
  s.prefill(ref.greedy_prompt);
  s.sample();
  s.decode();
  const size_t ops = s.recorded_ops();
  EXPECT_GT(ops, 10u);
  for (int i = 0; i < 20; ++i) s.decode();
  EXPECT_EQ(s.recorded_ops(), ops);
  EXPECT_EQ(s.captures(), 1);
}

// decode_many(n) queues n replays without host round trips in between and
// must give exactly the tokens of n decode() calls; n that do not fit are
// refused before anything runs.
TEST(CompiledDecodeState, DecodeManyEqualsRepeatedDecode) {
  for (const std::string family : {"qwen2", "gemma2"}) {
    auto model = Model::load(fixtures_dir() / family, Device::CPU);
    const Reference ref = load_reference(family);
    SessionOptions so;
    so.capacity = 96;
    so.max_write = 4;
    ops::SamplingParams sp;
    sp.temperature = 0.8f;
    sp.top_k = 20;
    sp.seed = 9;
    std::vector<int32_t> one_by_one, queued;
    for (int mode = 0; mode < 2; ++mode) {
      Session s(model, so);
      s.sampling() = sp;
      s.prefill(ref.greedy_prompt);
      s.sample();
      std::vector<int32_t>& out = mode == 0 ? one_by_one : queued;
      if (mode == 0) {
        for (int i = 0; i < 40; ++i) out.push_back(s.decode());
      } else {
        for (int n : {1, 7, 32}) {
          auto part = s.decode_many(n);
          out.insert(out.end(), part.begin(), part.end());
        }
      }
      EXPECT_EQ(s.position(), int32_t(ref.greedy_prompt.size()) + 40);
      if (mode == 1) {
        const int32_t at = s.position();
        try {
          s.decode_many(96 - at + 1);
          FAIL() << "expected a capacity error";
        } catch (const Error& e) {
          EXPECT_THAT(e.what(), HasSubstr("do not fit"));
        }
        EXPECT_EQ(s.position(), at);
        EXPECT_EQ(s.decode_many(96 - at).size(), size_t(96 - at));
      }
    }
    EXPECT_EQ(one_by_one, queued) << family;
  }
}
