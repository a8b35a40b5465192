// Prefix reuse: a session that holds one sequence takes a new prompt by
// keeping the longest common prefix (whole chunks) and prefilling the rest;
// logits and every later token equal a fresh session's, bitwise.
#include <cmath>
#include <cstring>
#include <map>

#include <gtest/gtest.h>

#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "support/fixtures.h"

using namespace kvgraph;
using namespace kvgraph::testing;

namespace {

std::vector<float> logits_and_future(Session& s, int n, std::vector<int32_t>* tokens) {
  std::vector<float> out = s.last_logits();
  tokens->push_back(s.sample());
  for (int i = 0; i < n; ++i) {
    tokens->push_back(s.decode());
    auto l = s.last_logits();
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

class SessionPrefixReuse : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(SessionPrefixReuse, MatchesAFreshPrefillKeepingWholeChunks) {
  const std::string family = GetParam();
  auto model = Model::load(fixtures_dir() / family, Device::CPU);
  const Reference ref = load_reference(family);
  const std::vector<int32_t>& ids = ref.ids;  // the fixture's long sequence
  ASSERT_GE(ids.size(), 40u);
  const SessionOptions so{.capacity = 128, .max_write = 4};
  ops::SamplingParams sp;
  sp.temperature = 0.7f;
  sp.repetition_penalty = 1.1f;
  sp.seed = 11;
  Session s(model, so);
  s.sampling() = sp;
  // Held: 30 ids, then 20 generated tokens (rings wrap).
  s.prefill(std::span(ids).first(30));
  s.sample();
  for (int i = 0; i < 20; ++i) s.decode();
  const bool ring = [&] {
    for (int l = 0; l < s.cache().n_layers(); ++l)
      if (s.cache().policy(l).is_ring()) return true;
    return false;
  }();
  // bitwise: the kept rows were written by the same prefill chunks a fresh
  // session runs. Rows written by decode steps (T = 1) agree with a chunked
  // prefill's only up to rounding (another product shape), so a prefix that
  // holds generated tokens is compared with a tolerance.
  auto check = [&](const std::vector<int32_t>& prompt, int32_t expect_reused, bool bitwise) {
    const Session::PrefixReuse r = s.prefill_reusing(prompt);
    EXPECT_EQ(r.reused, expect_reused) << family;
    EXPECT_EQ(r.prefilled, static_cast<int32_t>(prompt.size()) - expect_reused);
    EXPECT_EQ(s.tokens(), prompt);
    Session fresh(model, so);
    fresh.sampling() = sp;
    fresh.prefill(prompt);
    std::vector<int32_t> ta, tb;
    auto la = logits_and_future(s, 6, &ta);
    auto lb = logits_and_future(fresh, 6, &tb);
    EXPECT_EQ(ta, tb) << family;
    ASSERT_EQ(la.size(), lb.size());
    if (bitwise) {
      EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << family << " reused " << r.reused;
    } else {
      float worst = 0;
      for (size_t i = 0; i < la.size(); ++i) worst = std::max(worst, std::abs(la[i] - lb[i]));
      EXPECT_LT(worst, 1e-4f) << family << " reused " << r.reused;
    }
  };
  // Everything held (50), then 6 more: keeps 48 (whole chunks), rolls back 2.
  std::vector<int32_t> extended(s.tokens());
  extended.insert(extended.end(), ids.begin() + 30, ids.begin() + 36);
  check(extended, 48, false);
  // Differs at 27: whole chunks keep 24, 38 back from the end, beyond what a
  // ring can roll back: models with ring layers start over.
  std::vector<int32_t> diverging(ids.begin(), ids.begin() + 27);
  diverging.push_back((ids[27] + 1) % ref.vocab);
  check(diverging, ring ? 0 : 24, true);
  // A conversation goes on: all held + 3 new ids; rolls back at most 3.
  std::vector<int32_t> next(s.tokens());
  next.insert(next.end(), {1, 2, 3});
  check(next, static_cast<int32_t>(s.tokens().size() - s.tokens().size() % 4), false);
  // A prompt that extends a prefilled one (what cache-prompt saves): bitwise.
  std::vector<int32_t> first(ids.begin(), ids.begin() + 13), longer(ids.begin(), ids.begin() + 31);
  s.reset();
  s.prefill(first);
  check(longer, 12, true);
}

INSTANTIATE_TEST_SUITE_P(Families, SessionPrefixReuse, ::testing::ValuesIn(fixture_families()),
                         [](const auto& info) { return info.param; });
