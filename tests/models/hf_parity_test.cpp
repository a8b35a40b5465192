// Every family against Hugging Face transformers' logits (the independent
// reference), at every position, with prefill chunks of 1, 3 and the whole
// sequence; and greedy continuations token for token.
#include <cmath>

#include <gtest/gtest.h>

#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "support/fixtures.h"

using namespace kvgraph;
using namespace kvgraph::testing;

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, LogitsMatchTransformersAtEveryPositionForEveryChunkSize) {
  const Reference ref = load_reference(GetParam());
  auto model = Model::load(fixtures_dir() / GetParam(), Device::CPU);
  const int V = ref.vocab;
  ASSERT_EQ(model->config().vocab_size, V);
  for (int chunk : {1, 3, static_cast<int>(ref.ids.size())}) {
    SessionOptions so;
    so.capacity = static_cast<int32_t>(ref.ids.size());
    so.max_write = chunk;
    so.all_logits = true;
    Session s(model, so);
    double worst = 0;
    int worst_pos = -1;
    s.prefill(ref.ids, [&](int32_t position, int32_t n, const std::vector<float>& logits) {
      for (int t = 0; t < n; ++t)
        for (int j = 0; j < V; ++j) {
          const double d = std::abs(double(logits[size_t(t) * V + j]) - ref.logits[size_t(position + t) * V + j]);
          if (d > worst) worst = d, worst_pos = position + t;
        }
    });
    EXPECT_LT(worst, 1e-3) << GetParam() << " chunk " << chunk << ": worst at position " << worst_pos;
  }
}

TEST_P(HfParity, GreedyContinuationMatchesTransformers) {
  const Reference ref = load_reference(GetParam());
  auto model = Model::load(fixtures_dir() / GetParam(), Device::CPU);
  for (bool eager : {true, false}) {
    SessionOptions so;
    so.capacity = static_cast<int32_t>(ref.greedy_prompt.size() + ref.greedy.size());
    so.max_write = 5;
    so.eager = eager;
    Session s(model, so);
    s.set_banned_tokens(ref.eos);
    s.prefill(ref.greedy_prompt);
    std::vector<int32_t> out{s.sample()};
    while (out.size() < ref.greedy.size()) out.push_back(s.decode());
    EXPECT_EQ(out, ref.greedy) << GetParam() << (eager ? " eager" : " compiled");
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfParity, ::testing::ValuesIn(fixture_families()),
                         [](const auto& info) { return info.param; });
