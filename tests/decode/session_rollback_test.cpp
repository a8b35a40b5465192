// Session::trim rolls back the cache and the step state together: after a
// rollback (ring layers included, after many wraps) every later token and
// logit equals that of a session that never saw the removed tokens. Beyond
// what a ring can roll back, the kept ids are prefilled again and the result
// equals a fresh session that prefilled them. Failing steps are
// transactional.
#include <cstring>
#include <map>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "support/fixtures.h"
#include "support/model_cache.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;

namespace {

std::shared_ptr<const Model> fixture(const std::string& family) { return shared_fixture(family); }

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

// m decode steps, recording each token and the logits it came from.
Trace continue_decoding(Session& s, int m) {
  Trace t;
  for (int i = 0; i < m; ++i) {
    t.tokens.push_back(s.decode());
    t.logits.push_back(s.last_logits());
  }
  return t;
}

bool bitwise_equal(const Trace& a, const Trace& b) {
  if (a.tokens != b.tokens || a.logits.size() != b.logits.size()) return false;
  for (size_t i = 0; i < a.logits.size(); ++i)
    if (a.logits[i].size() != b.logits[i].size() ||
        std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

ops::SamplingParams sampled(uint64_t seed) {
  ops::SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.repetition_penalty = 1.3f;  // exercises the seen mask, which must roll back too
  p.seed = seed;
  return p;
}

bool has_ring(const Session& s) {
  for (int l = 0; l < s.cache().n_layers(); ++l)
    if (s.cache().policy(l).is_ring()) return true;
  return false;
}

}  // namespace

// After prefill + k decode steps (k large enough for the rings to wrap many
// times), write r junk tokens (prefill chunks and decode steps mixed), trim
// them off and restore the pending token: the next m tokens and logits equal
// those of a session that never saw the junk. r <= max_write rolls back in
// place; beyond, the kept ids are prefilled again and the result equals a
// fresh session that prefilled them.
RC_GTEST_PROP(SessionRollbackProperty, LaterOutputEqualsACacheThatNeverSawTheTokens, ()) {
  const std::string family = *rc::gen::element<std::string>("mistral", "gemma2", "gemma3", "qwen2", "llama");
  const int mw = *rc::gen::inRange(2, 7);
  const bool eager = *rc::gen::element(false, true);
  const bool greedy = *rc::gen::element(false, true);
  const uint64_t seed = *rc::gen::inRange<uint64_t>(1, 1000);
  const int prompt_len = *rc::gen::inRange(1, 20);
  const int k = *rc::gen::inRange(40, 90);  // windows are 8-16: pools of ~20 rows wrap several times
  const int r = *rc::gen::inRange(1, 3 * mw + 1);
  const int m = *rc::gen::inRange(1, 12);
  auto model = fixture(family);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> prompt(prompt_len);
  for (auto& id : prompt) id = static_cast<int32_t>(rng() % model->config().vocab_size);

  SessionOptions so;
  so.capacity = 256;
  so.max_write = mw;
  so.eager = eager;
  const ops::SamplingParams sp = greedy ? ops::SamplingParams{} : sampled(seed);
  Session a(model, so), b(model, so);
  for (Session* s : {&a, &b}) {
    s->sampling() = sp;
    s->prefill(prompt);
    s->sample();
    for (int i = 0; i < k; ++i) s->decode();
  }
  const int32_t n0 = a.position();
  const int32_t p0 = *a.pending();

  // Junk: decode steps and prefill chunks of random ids, r tokens in all.
  int written = 0;
  while (written < r) {
    if (rng() % 2 && a.pending()) {
      a.decode();
      written += 1;
    } else {
      const int T = std::min<int>(r - written, 1 + rng() % mw);
      std::vector<int32_t> junk(T);
      for (auto& id : junk) id = static_cast<int32_t>(rng() % model->config().vocab_size);
      a.prefill(junk);
      if (rng() % 2) a.sample();
      written += T;
    }
  }
  RC_ASSERT(a.position() == n0 + r);
  const Session::TrimResult tr = a.trim(n0);
  RC_ASSERT(tr.removed == r);
  RC_ASSERT(a.position() == n0);
  if (r <= mw || !has_ring(a))
    RC_ASSERT(tr.reprefilled == 0);  // in place, after many wraps
  else
    RC_ASSERT(tr.reprefilled == n0);
  a.set_pending(p0);
  RC_ASSERT(a.tokens() == b.tokens());

  const Trace ta = continue_decoding(a, m);
  if (tr.reprefilled == 0) {
    RC_ASSERT(bitwise_equal(ta, continue_decoding(b, m)));
  } else {
    // Equal to a fresh session that prefilled the kept ids.
    Session c(model, so);
    c.sampling() = sp;
    c.prefill(b.tokens());
    c.set_pending(p0);
    RC_ASSERT(bitwise_equal(ta, continue_decoding(c, m)));
  }
}

TEST(SessionRollback, RingRollsBackUpToMaxWriteAfterWrapsInPlace) {
  auto model = fixture("mistral");  // every layer a ring (window 12)
  SessionOptions so;
  so.capacity = 400;
  so.max_write = 4;
  Session s(model, so);
  const Reference ref = load_reference("mistral");
  s.prefill(ref.greedy_prompt);
  s.sample();
  for (int i = 0; i < 200; ++i) s.decode();  // pool 15: 14 wraps
  const int32_t L = s.position();
  EXPECT_TRUE(s.can_roll_back(L - 4));
  EXPECT_FALSE(s.can_roll_back(L - 5));
  const int32_t at = s.tokens()[L - 4];
  const auto r = s.trim(L - 4);
  EXPECT_EQ(r.removed, 4);
  EXPECT_EQ(r.reprefilled, 0);
  EXPECT_EQ(s.position(), L - 4);
  EXPECT_EQ(s.pending(), at);
  EXPECT_EQ(static_cast<int32_t>(s.tokens().size()), L - 4);
  // One more than max_write back: the kept ids are prefilled again.
  const auto r2 = s.trim(L - 9);
  EXPECT_EQ(r2.reprefilled, L - 9);
}

TEST(SessionRollback, TrimOutsideTheSequenceIsAClearError) {
  Session s(fixture("llama"), {.capacity = 64, .max_write = 4});
  s.prefill(std::vector<int32_t>{1, 2, 3});
  try {
    s.trim(4);
    FAIL() << "trim past the end must throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[session] trim(4): must be within [0, 3]"));
  }
  EXPECT_THROW(s.trim(-1), Error);
  EXPECT_EQ(s.position(), 3);
}

TEST(SessionRollback, PendingTokenFollowsTheRollback) {
  Session s(fixture("llama"), {.capacity = 64, .max_write = 4});
  s.prefill(std::vector<int32_t>{5, 6, 7, 8, 9});
  s.trim(3);
  ASSERT_EQ(s.pending(), 8);  // the token that was at position 3 is fed next
  EXPECT_EQ(s.tokens(), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_THROW(s.sample(), Error);  // the logits of position 2 are gone
  EXPECT_THROW(s.set_pending(100000), Error);
  EXPECT_EQ(s.pending(), 8);
}
