#pragma once
// A prefill and decode run recorded token by token, for comparing two runs
// bit for bit (compiled against eager decode, say).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kvgraph/model.h"
#include "kvgraph/session.h"

namespace kvgraph::testing {

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // f32 [vocab] per token: the logits it was sampled from
};

// Prefill `prompt` into a fresh session of `m` (options `so`, sampler `sp`),
// then decode `steps` tokens; records every token and the logits it was
// sampled from. `captures`: where to store the session's recording count.
inline Trace decode_trace(std::shared_ptr<const Model> m, const SessionOptions& so, const std::vector<int32_t>& prompt,
                          int steps, const ops::SamplingParams& sp, int* captures = nullptr) {
  Session s(std::move(m), so);
  s.sampling() = sp;
  Trace t;
  s.prefill(prompt);
  t.tokens.push_back(s.sample());
  t.logits.push_back(s.last_logits());
  for (int i = 0; i < steps; ++i) {
    t.tokens.push_back(s.decode());
    t.logits.push_back(s.last_logits());
  }
  if (captures) *captures = s.captures();
  return t;
}

// The same tokens and the same logits bit for bit; a failure names `what` and the step.
inline void expect_bitwise(const Trace& a, const Trace& b, const std::string& what) {
  ASSERT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)))
        << what << ": logits differ at step " << i;
}

}  // namespace kvgraph::testing
