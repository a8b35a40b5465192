// Sessions over quantized KV caches (issue 15): the recorded decode step
// (CPU tape) equals eager decoding bit for bit for every format, with ring
// layers wrapped many times; rollback, fork and prefix reuse behave as they
// do in plain storage. (Save/restore: session_file_test.cpp.)
#include <cstring>
#include <map>

#include <gtest/gtest.h>

#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "support/fixtures.h"

using namespace kvgraph;
using namespace kvgraph::testing;

namespace {

std::shared_ptr<const Model> model_of(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const Model>> models;
  auto& m = models[name];
  if (!m)
    m = Model::load(name == "default" ? std::filesystem::path(KVGRAPH_SOURCE_DIR) / "models" / "default"
                                      : fixtures_dir() / name,
                    Device::CPU);
  return m;
}

std::vector<int32_t> prompt_of(const std::string& name) {
  if (name != "default") return load_reference(name).greedy_prompt;
  return {2, 412, 87, 1093, 15, 733, 29, 3001, 8, 64, 101, 2047};
}

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // every step's, concatenated
  bool operator==(const Trace& o) const {
    return tokens == o.tokens && logits.size() == o.logits.size() &&
           std::memcmp(logits.data(), o.logits.data(), logits.size() * sizeof(float)) == 0;
  }
};

Trace decode(Session& s, int n) {
  Trace t;
  for (int i = 0; i < n; ++i) {
    t.tokens.push_back(s.decode());
    const auto l = s.last_logits();
    t.logits.insert(t.logits.end(), l.begin(), l.end());
  }
  return t;
}

ops::SamplingParams sampled(uint64_t seed) {
  ops::SamplingParams p;
  p.temperature = 0.9f;
  p.repetition_penalty = 1.2f;
  p.seed = seed;
  return p;
}

struct Case {
  std::string model;
  KvStorage storage;
};

std::string describe(const Case& c) { return c.model + " " + kv_storage_name(c.storage); }

const KvFormat kI8g32{KvType::Int8, 32}, kI4g32{KvType::Int4, 32}, kI8g64{KvType::Int8, 64},
    kI4g64{KvType::Int4, 64}, kFp8{KvType::Fp8};

// gemma3: flat and ring layers (window 12), head_dim 32; mistral: every layer
// a ring, head_dim 16 (fp8 only); the trained default model: head_dim 64.
std::vector<Case> cases() {
  return {{"gemma3", kI8g32}, {"gemma3", kI4g32}, {"gemma3", kFp8}, {"gemma3", KvStorage{kI8g32, kI4g32}},
          {"gemma3", KvStorage{DType::BF16, kI4g32}}, {"mistral", kFp8}, {"default", kI8g64}, {"default", kI4g64}};
}

}  // namespace

TEST(KvQuantSession, CompiledEqualsEagerBitwiseForEveryFormat) {
  for (const Case& c : cases()) {
    // Fixture rings (pool 15) wrap 5 times; the default model's (pool 67) once.
    const int steps = c.model == "default" ? 70 : 80;
    SessionOptions so{.capacity = 240, .max_write = 4, .kv_storage = c.storage};
    Trace t[2];
    for (bool eager : {true, false}) {
      so.eager = eager;
      Session s(model_of(c.model), so);
      s.sampling() = sampled(5);
      s.prefill(prompt_of(c.model));
      s.sample();
      t[eager ? 0 : 1] = decode(s, steps);
      if (!eager) EXPECT_EQ(s.captures(), 1) << describe(c);
    }
    ASSERT_TRUE(t[0] == t[1]) << describe(c);
    // Queued steps (decode_many, which snapshots the rings first) give the same tokens.
    so.eager = false;
    Session q(model_of(c.model), so);
    q.sampling() = sampled(5);
    q.prefill(prompt_of(c.model));
    q.sample();
    EXPECT_EQ(q.decode_many(steps), t[0].tokens) << describe(c);
  }
}

// Junk tokens written after many wraps, then trimmed off (at most max_write:
// in place; more: the kept ids are prefilled again): what follows equals a
// session that never saw them, and a fork continues like the original.
TEST(KvQuantSession, RollbackAndForkContinueBitwise) {
  for (const Case& c : cases()) {
    if (c.model == "default" && c.storage.k.type == KvType::Int8) continue;  // one default-model case keeps it short
    SessionOptions so{.capacity = 240, .max_write = 4, .kv_storage = c.storage};
    for (int junk : {3, 6}) {
      Session a(model_of(c.model), so), b(model_of(c.model), so);
      for (Session* s : {&a, &b}) {
        s->sampling() = sampled(9);
        s->prefill(prompt_of(c.model));
        s->sample();
        decode(*s, c.model == "default" ? 60 : 40);  // past the default model's pool of 67
      }
      const int32_t at = a.position();
      const int32_t pending = *a.pending();
      a.prefill(std::vector<int32_t>(junk, 7));
      const Session::TrimResult r = a.trim(at);
      EXPECT_EQ(r.reprefilled, junk > 4 ? at : 0) << describe(c);
      a.set_pending(pending);
      auto fork = a.fork();
      const Trace ta = decode(a, 12);
      if (r.reprefilled == 0) {
        EXPECT_TRUE(ta == decode(b, 12)) << describe(c) << " junk " << junk;
      } else {  // equal to a fresh session that prefilled the kept ids
        Session f(model_of(c.model), so);
        f.sampling() = sampled(9);
        f.prefill(b.tokens());
        f.set_pending(pending);
        EXPECT_TRUE(ta == decode(f, 12)) << describe(c) << " junk " << junk;
      }
      EXPECT_TRUE(decode(*fork, 12) == ta) << describe(c) << " fork";
    }
  }
}

// A prompt that extends what the session holds keeps whole chunks and
// prefills the rest: the same chunks as a fresh prefill, so the same bytes
// in every pool and the same logits, bit for bit.
TEST(KvQuantSession, PrefixReuseEqualsAFreshPrefill) {
  for (const Case& c : cases()) {
    const SessionOptions so{.capacity = 128, .max_write = 4, .kv_storage = c.storage};
    std::vector<int32_t> longer = prompt_of(c.model);
    for (int i = 0; longer.size() < 40; ++i) longer.push_back(longer[i % longer.size()] ^ 1);
    const std::vector<int32_t> first(longer.begin(), longer.begin() + 13);
    Session s(model_of(c.model), so), fresh(model_of(c.model), so);
    s.prefill(first);
    const Session::PrefixReuse r = s.prefill_reusing(longer);
    EXPECT_EQ(r.reused, 12) << describe(c);
    fresh.prefill(longer);
    EXPECT_EQ(s.last_logits(), fresh.last_logits()) << describe(c);
    for (Session* x : {&s, &fresh}) x->sampling() = sampled(3);
    EXPECT_EQ(s.sample(), fresh.sample()) << describe(c);
    EXPECT_TRUE(decode(s, 10) == decode(fresh, 10)) << describe(c);
  }
}
