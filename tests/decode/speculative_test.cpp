// Speculative decoding (kvgraph/speculative.h) against plain decoding, its
// independent reference:
//   - a verify step's rows are bitwise the logits (and tokens) of decode
//     steps fed the same tokens, on every family;
//   - greedy speculative generate() returns exactly plain generate()'s tokens
//     and finish reason and leaves the same session (every family; prompt
//     lookup, the model as its own draft, another model as draft; K in
//     {1, 4, 7}; ring layers wrapped many times);
//   - sampled speculative decoding draws each token from plain sampling's
//     distribution (chi-square over many seeds, V = 256), and a wrong rule
//     is caught by the same test;
//   - stop strings, max_tokens, eos and a full cache end a run exactly as in
//     plain decoding (the default model and its tokenizer).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/ops.h"
#include "kvgraph/scalar.h"
#include "kvgraph/session.h"
#include "kvgraph/speculative.h"
#include "kvgraph/tokenizer.h"
#include "support/fixtures.h"
#include "support/model_cache.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;

namespace {

std::shared_ptr<const Model> fixture(const std::string& family) { return shared_fixture(family); }

std::filesystem::path default_dir() { return std::filesystem::path(KVGRAPH_SOURCE_DIR) / "models" / "default"; }

bool same_bits(const float* a, const float* b, size_t n) { return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0; }

bool has_ring(const Session& s) {
  for (int l = 0; l < s.cache().n_layers(); ++l)
    if (s.cache().policy(l).is_ring()) return true;
  return false;
}

// A prompt that makes the random fixtures repeat themselves a little, so that
// prompt lookup finds something.
std::vector<int32_t> prompt_for(const std::string& family) {
  std::vector<int32_t> p = load_reference(family).greedy_prompt;
  const std::vector<int32_t> again = p;
  p.insert(p.end(), again.begin(), again.end());
  return p;
}

// Everything generate() reports and the state it leaves behind.
struct Outcome {
  GenerateResult r;
  std::vector<int32_t> tokens;  // the session's tokens afterwards
  std::optional<int32_t> pending;
  std::vector<int32_t> next;    // three decode steps after it (the session must be usable and the same)
  std::vector<float> next_logits;
};

Outcome run(std::shared_ptr<const Model> m, const std::vector<int32_t>& prompt, const GenerateOptions& go,
        const SessionOptions& so, const ops::SamplingParams& sp = {}) {
  Session s(m, so);
  s.sampling() = sp;
  Outcome out;
  out.r = s.generate(prompt, nullptr, go);
  out.tokens = s.tokens();
  out.pending = s.pending();
  if (out.r.finish != FinishReason::length && s.position() + 4 <= s.capacity()) {
    for (int i = 0; i < 3; ++i) out.next.push_back(s.decode());
    out.next_logits = s.last_logits();
  }
  return out;
}

void expect_same(const Outcome& plain, const Outcome& spec, const std::string& what) {
  EXPECT_EQ(spec.r.tokens, plain.r.tokens) << what;
  EXPECT_EQ(finish_reason_name(spec.r.finish), std::string(finish_reason_name(plain.r.finish))) << what;
  EXPECT_EQ(spec.r.last, plain.r.last) << what;
  EXPECT_EQ(spec.tokens, plain.tokens) << what;
  EXPECT_EQ(spec.pending, plain.pending) << what;
  EXPECT_EQ(spec.next, plain.next) << what;
  ASSERT_EQ(spec.next_logits.size(), plain.next_logits.size()) << what;
  EXPECT_TRUE(same_bits(spec.next_logits.data(), plain.next_logits.data(), plain.next_logits.size())) << what;
}

class SpeculativeFamily : public ::testing::TestWithParam<std::string> {};

}  // namespace

// Row i of a verify step equals, bit for bit, the logits and the token of a
// decode step fed token i at the same position with the same history; the
// session afterwards is the one those decode steps leave (the next decode
// agrees too). Greedy with a repetition penalty (so the per-row mask
// matters) and sampled.
TEST_P(SpeculativeFamily, VerifyRowsAreDecodeSteps) {
  auto m = fixture(GetParam());
  const int32_t V = m->config().vocab_size;
  for (float temperature : {0.0f, 0.9f}) {
    Session a(m, {.capacity = 96, .max_write = 8});
    a.sampling() = {.temperature = temperature, .top_k = 0, .top_p = 1.0f, .repetition_penalty = 1.3f, .seed = 5};
    a.prefill(prompt_for(GetParam()));
    a.sample();
    for (int i = 0; i < 30; ++i) a.decode();  // past the smallest ring pool (8 + 7 rows)
    std::unique_ptr<Session> b = a.fork();
    const std::vector<int32_t> props = {3, 17, 3, 250, 9, 0, 42};  // K = 7, repeats included
    const int32_t p0 = *a.pending();
    const std::vector<int32_t> y = a.verify(props);
    const std::vector<float> rows = a.verify_logits();
    ASSERT_EQ(y.size(), props.size() + 1);
    for (size_t i = 0; i <= props.size(); ++i) {
      if (i > 0) b->set_pending(props[i - 1]);
      const int32_t t = b->decode();
      const std::vector<float> l = b->last_logits();
      EXPECT_EQ(y[i], t) << "row " << i << " temperature " << temperature;
      EXPECT_TRUE(same_bits(rows.data() + i * V, l.data(), V)) << "row " << i << " temperature " << temperature;
    }
    EXPECT_EQ(a.tokens(), b->tokens());
    EXPECT_EQ(a.pending(), b->pending());
    EXPECT_EQ(a.tokens()[a.position() - 8], p0);
    EXPECT_EQ(a.decode(), b->decode());
    const auto la = a.last_logits(), lb = b->last_logits();
    EXPECT_TRUE(same_bits(la.data(), lb.data(), V));
  }
}

// The same over quantized KV caches on the CPU (its attention loops per
// query there too): int8 / int4 in groups of 32 and fp8, rings wrapped.
// (On CUDA a verify step over quantized pools goes to attend_kernel_q: close,
// not bitwise; docs/design.md.)
TEST(Speculative, VerifyRowsAreDecodeStepsOverQuantizedKv) {
  for (const auto& [family, name] : std::vector<std::pair<std::string, std::string>>{
           {"gemma2", "int8"}, {"gemma3", "int4"}, {"gemma2", "fp8"}, {"llama", "fp8"}}) {
    auto m = fixture(family);
    const int32_t V = m->config().vocab_size;
    Session a(m, {.capacity = 96, .max_write = 8, .kv_storage = parse_kv_format(name, 32)});
    a.sampling() = {.temperature = 0.0f, .repetition_penalty = 1.3f};
    a.prefill(prompt_for(family));
    a.sample();
    for (int i = 0; i < 30; ++i) a.decode();
    std::unique_ptr<Session> b = a.fork();
    const std::vector<int32_t> props = {3, 17, 3, 250, 9, 0, 42};
    const std::vector<int32_t> y = a.verify(props);
    const std::vector<float> rows = a.verify_logits();
    for (size_t i = 0; i <= props.size(); ++i) {
      if (i > 0) b->set_pending(props[i - 1]);
      EXPECT_EQ(y[i], b->decode()) << family << " " << name << " row " << i;
      const auto l = b->last_logits();
      EXPECT_TRUE(same_bits(rows.data() + i * V, l.data(), V)) << family << " " << name << " row " << i;
    }
    EXPECT_EQ(a.decode(), b->decode()) << family << " " << name;
  }
}

// accept(n, next) leaves what trim + set_pending leave, for every n, with
// rings that wrapped: the next decode steps agree bit for bit.
TEST_P(SpeculativeFamily, AcceptEqualsTrimAndSetPending) {
  auto m = fixture(GetParam());
  const int32_t V = m->config().vocab_size;
  Session base(m, {.capacity = 128, .max_write = 8});
  base.sampling() = {.temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .repetition_penalty = 1.2f, .seed = 9};
  base.prefill(prompt_for(GetParam()));
  base.sample();
  for (int i = 0; i < 40; ++i) base.decode();
  if (GetParam() == "gemma2") EXPECT_TRUE(has_ring(base));
  const std::vector<int32_t> props = {5, 6, 7, 8};
  for (int n = 0; n <= 4; ++n) {
    auto a = base.fork(), b = base.fork();
    const int32_t L = a->position();
    a->verify(props);
    a->accept(n, 77);
    b->verify(props);
    b->trim(L + 1 + n);
    b->set_pending(77);
    EXPECT_EQ(a->tokens(), b->tokens()) << n;
    EXPECT_EQ(a->pending(), b->pending()) << n;
    for (int i = 0; i < 4; ++i) EXPECT_EQ(a->decode(), b->decode()) << n;
    const auto la = a->last_logits(), lb = b->last_logits();
    EXPECT_TRUE(same_bits(la.data(), lb.data(), V)) << n;
  }
}

// Greedy speculative generate() == plain generate(): tokens, finish reason,
// the session left behind. Prompt lookup (n-gram 1 and 3), the model as its
// own draft (every proposal kept), another model of the same vocabulary as
// draft (many rejected); K = 1, 4, 7; max_write 8 so that the rings (windows
// 8-16) wrap many times over the 120 tokens.
TEST_P(SpeculativeFamily, GreedyOutputIsPlainOutput) {
  auto m = fixture(GetParam());
  const std::vector<int32_t> prompt = prompt_for(GetParam());
  const SessionOptions so{.capacity = 256, .max_write = 8};
  GenerateOptions go;
  go.max_tokens = 120;
  go.ignore_eos = true;  // long runs; the eos ending is tested below
  const Outcome plain = run(m, prompt, go, so);
  ASSERT_EQ(plain.r.tokens.size(), 120u);

  const std::string other = GetParam() == "llama" ? "qwen3" : "llama";
  for (int k : {1, 4, 7}) {
    PromptLookup lookup1(1), lookup3(3);
    DraftModel self(m, so), draft(fixture(other), so);
    std::vector<std::pair<Proposer*, std::string>> proposers = {
        {&lookup1, "lookup 1"}, {&lookup3, "lookup 3"}, {&self, "self draft"}, {&draft, other + " draft"}};
    for (auto& [p, name] : proposers) {
      go.proposer = p;
      go.draft_tokens = k;
      const Outcome spec = run(m, prompt, go, so);
      expect_same(plain, spec, name + " K=" + std::to_string(k));
      EXPECT_GT(spec.r.speculative.steps, 0) << name;
      if (p == &self) {
        EXPECT_EQ(spec.r.speculative.accepted, spec.r.speculative.proposed) << "a model agrees with itself";
        EXPECT_LT(spec.r.speculative.steps, 120 / (k + 1) + 2);
      }
      if (p == &draft) EXPECT_LT(spec.r.speculative.accepted, spec.r.speculative.proposed) << "rejections exercised";
    }
  }
  go.proposer = nullptr;
}

// Ends inside a speculative batch: eos (not ignored), max_tokens, and a full
// cache stop where plain decoding stops, and leave the same session.
TEST_P(SpeculativeFamily, GreedyEndsAsPlain) {
  auto m = fixture(GetParam());
  const std::vector<int32_t> prompt = prompt_for(GetParam());
  const SessionOptions so{.capacity = 512, .max_write = 8};
  // An end token the run meets: the 12th token of a run that ignores the model's own.
  GenerateOptions probe;
  probe.max_tokens = 12;
  probe.ignore_eos = true;
  const int32_t end = run(m, prompt, probe, so).r.tokens.back();
  PromptLookup lookup(2);
  DraftModel self(m, so);
  for (Proposer* p : std::vector<Proposer*>{&lookup, &self}) {
    for (int max_tokens : {1, 2, 5, 37}) {
      GenerateOptions go;
      go.max_tokens = max_tokens;
      go.extra_eos = {end};
      const Outcome plain = run(m, prompt, go, so);
      go.proposer = p;
      go.draft_tokens = 4;
      expect_same(plain, run(m, prompt, go, so), std::string(p->name()) + " max_tokens " + std::to_string(max_tokens));
    }
    // The cache fills: capacity 20 tokens past the prompt.
    GenerateOptions go;
    go.max_tokens = 100;
    go.ignore_eos = true;
    const SessionOptions so{.capacity = static_cast<int32_t>(prompt.size()) + 20, .max_write = 8};
    const Outcome plain = run(m, prompt, go, so);
    // (Mistral's layers all slide: its cache has no length limit.)
    if (GetParam() != "mistral") EXPECT_EQ(plain.r.finish, FinishReason::length);
    go.proposer = p;
    go.draft_tokens = 7;
    const Outcome spec = run(m, prompt, go, so);
    expect_same(plain, spec, std::string(p->name()) + " full cache");
  }
}

INSTANTIATE_TEST_SUITE_P(Families, SpeculativeFamily, ::testing::ValuesIn(fixture_families()));

// ---------------------------------------------------------------- prompt lookup

TEST(PromptLookup, EarliestLongestMatchThenShorterNgrams) {
  //                          0  1  2  3  4  5  6  7  8  9
  const std::vector<int32_t> s = {1, 2, 3, 7, 1, 2, 3, 8, 2, 3};
  // n = 3: [8, 2, 3] does not occur before; n = 2: [2, 3] first at 1 -> what follows position 3.
  EXPECT_EQ(PromptLookup::lookup(s, 3, 3), (std::vector<int32_t>{7, 1, 2}));
  EXPECT_EQ(PromptLookup::lookup(s, 1, 2), (std::vector<int32_t>{7, 1}));  // [3] first at 2
  // Truncated at the end of the sequence.
  EXPECT_EQ(PromptLookup::lookup(std::vector<int32_t>{4, 5, 4}, 2, 5), (std::vector<int32_t>{5, 4}));
  EXPECT_EQ(PromptLookup::lookup(std::vector<int32_t>{1, 2, 3, 4}, 3, 4), std::vector<int32_t>{});
  EXPECT_EQ(PromptLookup::lookup(std::vector<int32_t>{9}, 3, 4), std::vector<int32_t>{});
  EXPECT_EQ(PromptLookup::lookup(std::vector<int32_t>{}, 3, 4), std::vector<int32_t>{});
  // A 3-gram beats an earlier 1-gram.
  EXPECT_EQ(PromptLookup::lookup(std::vector<int32_t>{5, 9, 1, 2, 5, 6, 1, 2, 5}, 3, 2), (std::vector<int32_t>{6, 1}));
  EXPECT_THROW(PromptLookup(0), Error);
}

// ---------------------------------------------------------------- errors and transactions

TEST(Speculative, BadRequestsFailClearlyAndLeaveTheSession) {
  auto m = fixture("gemma2");
  Session s(m, {.capacity = 64, .max_write = 4});
  s.prefill(prompt_for("gemma2"));
  s.sample();
  const auto before = s.tokens();
  const int32_t p0 = *s.pending();
  EXPECT_THAT([&] { s.verify(std::vector<int32_t>{}); }, ::testing::ThrowsMessage<Error>(HasSubstr("at least one")));
  EXPECT_THAT([&] { s.verify(std::vector<int32_t>{1, 2, 3, 4}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("max_write 4")));
  EXPECT_THAT([&] { s.verify(std::vector<int32_t>{1, 256}); }, ::testing::ThrowsMessage<Error>(HasSubstr("out of range")));
  EXPECT_THAT([&] { s.accept(0, 1); }, ::testing::ThrowsMessage<Error>(HasSubstr("must follow verify")));
  EXPECT_EQ(s.tokens(), before);
  EXPECT_EQ(s.pending(), p0);

  GenerateOptions go;
  PromptLookup lookup(2);
  go.proposer = &lookup;
  go.draft_tokens = 4;  // max_write 4: at most 3
  EXPECT_THAT([&] { s.generate(std::vector<int32_t>{1}, nullptr, go); },
              ::testing::ThrowsMessage<Error>(HasSubstr("draft_tokens must be in [1, 3]")));

  DraftModel wrong(Model::load(default_dir(), Device::CPU), {.capacity = 64});
  go.proposer = &wrong;
  go.ignore_eos = true;
  go.draft_tokens = 2;
  EXPECT_THAT([&] { s.generate(std::vector<int32_t>{1}, nullptr, go); },
              ::testing::ThrowsMessage<Error>(HasSubstr("the draft model's vocabulary has 4096 ids, the target's 256")));
}

// A verify step that fails after its kernels ran (fault injection) leaves
// the session as it was: the next steps equal those of an untouched copy.
TEST(Speculative, FailedVerifyIsTransactional) {
  auto m = fixture("gemma3");
  Session s(m, {.capacity = 128, .max_write = 8});
  s.sampling().temperature = 0.0f;
  s.prefill(prompt_for("gemma3"));
  s.sample();
  for (int i = 0; i < 40; ++i) s.decode();
  auto twin = s.fork();
  s.set_fault_injection([](std::string_view point) {
    if (point == "verify:after_step") throw Error("[test] injected device error");
  });
  EXPECT_THROW(s.verify(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}), Error);
  s.set_fault_injection({});
  EXPECT_EQ(s.tokens(), twin->tokens());
  EXPECT_EQ(s.pending(), twin->pending());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.decode(), twin->decode());
  // A verify that does not fit is CacheFull, before anything is written.
  Session full(m, {.capacity = 10, .max_write = 8});
  full.prefill(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7});
  full.sample();
  EXPECT_THROW(full.verify(std::vector<int32_t>{1, 2, 3}), CacheFull);
  EXPECT_EQ(full.position(), 7);
}

// ---------------------------------------------------------------- the default model, with text

namespace {

struct DefaultModel {
  std::shared_ptr<Model> model = Model::load(default_dir(), Device::CPU);
  Tokenizer tok = Tokenizer::from_file(default_dir());
};

DefaultModel& dm() {
  static DefaultModel d;
  return d;
}

// A copy-heavy prompt: a passage, then the request to write it again.
std::vector<int32_t> copy_prompt() {
  const std::string passage =
      "A day for firm decisions!!!!! Or is it? You will be successful in love. Good news from afar can bring "
      "you a welcome visitor. You have a deep appreciation of the arts and music.";
  return dm().tok.encode(passage + "\n\nAgain:\n" + passage.substr(0, 20), true);
}

struct TextRun {
  GenerateResult r;
  std::string streamed;
};

TextRun text_run(const GenerateOptions& go, int32_t capacity, int max_write = 64) {
  Session s(dm().model, {.capacity = capacity, .max_write = max_write});
  s.sampling().temperature = 0.0f;
  TextRun t;
  t.r = s.generate(copy_prompt(), &dm().tok, go, [&](int32_t, std::string_view piece) { t.streamed += piece; });
  return t;
}

}  // namespace

// Stop strings, max_tokens and a full cache on the trained default model:
// the speculative run streams and returns exactly the plain run's text.
TEST(SpeculativeText, StopsExactlyAsPlain) {
  GenerateOptions go;
  go.max_tokens = 80;
  const TextRun plain = text_run(go, 512);
  ASSERT_GT(plain.r.text.size(), 40u);
  PromptLookup lookup(3);
  DraftModel self(dm().model, {.capacity = 512});
  for (Proposer* p : std::vector<Proposer*>{&lookup, &self}) {
    GenerateOptions sg = go;
    sg.proposer = p;
    sg.draft_tokens = 5;
    TextRun spec = text_run(sg, 512);
    EXPECT_EQ(spec.r.tokens, plain.r.tokens) << p->name();
    EXPECT_EQ(spec.r.text, plain.r.text) << p->name();
    EXPECT_EQ(spec.streamed, plain.streamed) << p->name();
    EXPECT_GT(spec.r.speculative.accepted, 0) << p->name();

    // A stop string in the middle of the text (it ends a speculative batch early).
    GenerateOptions stop = go;
    stop.stop = {plain.r.text.substr(25, 6)};
    const TextRun ps = text_run(stop, 512);
    ASSERT_EQ(ps.r.finish, FinishReason::stop);
    stop.proposer = p;
    stop.draft_tokens = 5;
    const TextRun ss = text_run(stop, 512);
    EXPECT_EQ(ss.r.finish, FinishReason::stop) << p->name();
    EXPECT_EQ(ss.r.tokens, ps.r.tokens) << p->name();
    EXPECT_EQ(ss.r.text, ps.r.text) << p->name();
    EXPECT_EQ(ss.streamed, ps.streamed) << p->name();

    // A full cache.
    const int32_t cap = static_cast<int32_t>(copy_prompt().size()) + 23;
    GenerateOptions len = go;
    const TextRun pl = text_run(len, cap);
    ASSERT_EQ(pl.r.finish, FinishReason::length);
    len.proposer = p;
    len.draft_tokens = 7;
    const TextRun sl = text_run(len, cap);
    EXPECT_EQ(sl.r.finish, FinishReason::length) << p->name();
    EXPECT_EQ(sl.r.tokens, pl.r.tokens) << p->name();
  }
}

// ---------------------------------------------------------------- sampled: the distribution

namespace {

// Pearson's chi-square of observed counts against probabilities p (bins
// with expected count < 5 pooled), and its degrees of freedom.
std::pair<double, int> chi_square(const std::map<int32_t, int>& counts, const std::vector<float>& p, int n) {
  double chi = 0, pooled_e = 0;
  int pooled_o = 0, bins = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = double(p[i]) * n;
    auto it = counts.find(static_cast<int32_t>(i));
    const int o = it == counts.end() ? 0 : it->second;
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    chi += (o - e) * (o - e) / e;
    ++bins;
  }
  if (pooled_e > 0) {
    chi += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1e-9);
    ++bins;
  }
  return {chi, bins - 1};
}

// Upper 0.1% point of chi-square with `df` degrees of freedom
// (Wilson-Hilferty; z = 3.09).
double chi_critical(int df) {
  const double z = 3.0902, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// The probabilities plain sampling draws the pending token's successor from,
// computed by the sampler's own candidate function.
std::vector<float> plain_distribution(Session& s) {
  const auto l = s.last_logits();
  std::vector<uint8_t> seen(l.size(), 0);
  for (int32_t t : s.tokens()) seen[t] = 1;
  const ops::SampleCandidates c = ops::sampling_candidates(l.data(), static_cast<int>(l.size()), s.sampling(),
                                                          nullptr, 0, seen.data());
  std::vector<float> p(l.size(), 0.0f);
  for (size_t i = 0; i < c.ids.size(); ++i) p[c.ids[i]] = c.weights[i] / c.sum;
  return p;
}

// A proposer that always proposes the same tokens (a point mass), or, when
// it "cheats", claims they were drawn from a uniform q it never used.
class Fixed final : public Proposer {
 public:
  explicit Fixed(std::vector<int32_t> t) : t_(std::move(t)) {}
  Proposal propose(const Session&, int k) override {
    Proposal p;
    p.tokens.assign(t_.begin(), t_.begin() + std::min<size_t>(k, t_.size()));
    return p;
  }
  const char* name() const override { return "fixed"; }

 private:
  std::vector<int32_t> t_;
};

struct Histograms {
  std::map<int32_t, int> first, second;  // second: of the runs that kept `given` as their first token
  int n = 0, n_second = 0;
  int32_t given = -1;
};

// `runs` speculative steps from one prefilled state (pending token 3; seeds
// i * 7919): the histogram of the first new token, and of the second one in
// the runs whose first proposal was `given` and was kept (a sample of p2 by
// the same argument). given < 0: the token kept first most often. p1, p2:
// plain sampling's distributions of those two tokens.
Histograms sample_steps(std::shared_ptr<const Model> m, Proposer& prop, const ops::SamplingParams& sp, int runs,
                        int32_t given, std::vector<float>* p1, std::vector<float>* p2) {
  Session base(m, {.capacity = 64, .max_write = 8});
  base.sampling() = sp;
  base.prefill(prompt_for("qwen2"));
  base.sample();
  base.set_pending(3);
  std::vector<std::vector<int32_t>> outs;
  for (int i = 1; i <= runs; ++i) {
    auto s = base.fork();
    s->sampling().seed = uint64_t(i) * 7919;
    SpeculativeStats st;
    outs.push_back(speculative_step(*s, prop, 3, st));
  }
  Histograms h;
  if (given < 0) {
    std::map<int32_t, int> kept;
    for (const auto& o : outs)
      if (o.size() > 1) ++kept[o[0]];
    int best = 0;
    for (auto [t, c] : kept)
      if (c > best) best = c, given = t;
  }
  h.given = given;
  for (const auto& o : outs) {
    ++h.first[o[0]];
    ++h.n;
    if (o[0] == given && o.size() > 1) {  // `given` proposed first and kept
      ++h.second[o[1]];
      ++h.n_second;
    }
  }
  // The reference distributions: of the token after the pending one, and of
  // the one after that when `given` came first.
  auto s = base.fork();
  s->decode();
  *p1 = plain_distribution(*s);
  s->trim(s->position() - 1);
  s->set_pending(3);
  s->decode();
  s->set_pending(given);
  s->decode();
  *p2 = plain_distribution(*s);
  return h;
}

}  // namespace

// The most likely token after pending token 3 (the state sample_steps starts from).
int32_t likeliest(std::shared_ptr<const Model> m, const ops::SamplingParams& sp) {
  Session probe(m, {.capacity = 64, .max_write = 8});
  probe.sampling() = sp;
  probe.prefill(prompt_for("qwen2"));
  probe.sample();
  probe.set_pending(3);
  probe.decode();
  const std::vector<float> q = plain_distribution(probe);
  return static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin());
}

// Prompt lookup is a point mass: each emitted token must still follow plain
// sampling's distribution, the first and (given the first) the second. With
// a repetition penalty, top-k and top-p, as the sampler applies them. (The
// random fixtures are peaked at temperature 1: 3-4 spreads them over
// tens of tokens.)
TEST(SpeculativeSampled, PointMassProposalsKeepTheDistribution) {
  auto m = fixture("qwen2");
  for (const ops::SamplingParams sp : {ops::SamplingParams{.temperature = 4.0f, .seed = 0},
                                       ops::SamplingParams{.temperature = 3.0f, .top_k = 30, .top_p = 0.9f,
                                                           .repetition_penalty = 1.3f}}) {
    // Propose the most likely token first, so that both the kept and the
    // rejected branches happen often.
    const int32_t top = likeliest(m, sp);
    Fixed prop({top, 11, 12});
    std::vector<float> p1, p2;
    const Histograms h = sample_steps(m, prop, sp, 3000, top, &p1, &p2);
    auto [c1, df1] = chi_square(h.first, p1, h.n);
    ASSERT_GE(df1, 10);
    EXPECT_LT(c1, chi_critical(df1)) << "first token, df " << df1;
    ASSERT_GT(h.n_second, 300);
    auto [c2, df2] = chi_square(h.second, p2, h.n_second);
    ASSERT_GE(df2, 5);
    EXPECT_LT(c2, chi_critical(df2)) << "second token, df " << df2;
    // The test has power: always keeping the proposal is far off.
    std::map<int32_t, int> wrong = {{top, h.n}};
    EXPECT_GT(chi_square(wrong, p1, h.n).first, chi_critical(df1));
  }
}

// A draft model of another family samples proposals from its own q: the
// min(1, p/q) rule and the residual draw restore p (it rarely agrees with
// the target, so this mostly exercises the residual draw).
TEST(SpeculativeSampled, DraftProposalsKeepTheDistribution) {
  auto m = fixture("qwen2");
  const ops::SamplingParams sp{.temperature = 3.0f, .seed = 0};
  DraftModel draft(fixture("llama"), {.capacity = 64, .max_write = 8});
  std::vector<float> p1, p2;
  const Histograms h = sample_steps(m, draft, sp, 3000, -1, &p1, &p2);
  auto [c1, df1] = chi_square(h.first, p1, h.n);
  ASSERT_GE(df1, 10);
  EXPECT_LT(c1, chi_critical(df1)) << "first token, df " << df1;
}

namespace {

// The target's own model at another temperature as the draft: q overlaps p
// without being p, so proposals are kept and rejected often. (A residual
// draw from p without x instead of max(0, p - q) fails this test and the
// previous one with chi-square 118-186 against critical values 84-85.)
class TemperedSelf final : public Proposer {
 public:
  explicit TemperedSelf(float temperature) : temperature_(temperature) {}
  Proposal propose(const Session& target, int k) override {
    Proposal p;
    auto d = const_cast<Session&>(target).fork();
    ops::SamplingParams sp = target.sampling();
    sp.temperature = temperature_;
    sp.seed ^= 0x5bd1e995u;
    d->sampling() = sp;
    std::vector<uint8_t> seen(target.model().config().vocab_size, 0);
    for (int32_t t : target.tokens()) seen[t] = 1;
    seen[*target.pending()] = 1;
    for (int i = 0; i < k; ++i) {
      const int32_t t = d->decode();
      const auto l = d->last_logits();
      const ops::SampleCandidates c =
          ops::sampling_candidates(l.data(), static_cast<int>(l.size()), sp, nullptr, 0, seen.data());
      std::vector<float> q(l.size(), 0.0f);
      for (size_t j = 0; j < c.ids.size(); ++j) q[c.ids[j]] = c.weights[j] / c.sum;
      p.tokens.push_back(t);
      p.q.push_back(std::move(q));
      seen[t] = 1;
    }
    return p;
  }
  const char* name() const override { return "tempered self"; }

 private:
  float temperature_;
};

}  // namespace

TEST(SpeculativeSampled, OverlappingDraftKeepsTheDistribution) {
  auto m = fixture("qwen2");
  const ops::SamplingParams sp{.temperature = 3.0f, .top_p = 0.95f, .repetition_penalty = 1.2f};
  TemperedSelf draft(1.5f);
  std::vector<float> p1, p2;
  const Histograms h = sample_steps(m, draft, sp, 3000, -1, &p1, &p2);
  auto [c1, df1] = chi_square(h.first, p1, h.n);
  ASSERT_GE(df1, 10);
  EXPECT_LT(c1, chi_critical(df1)) << "first token, df " << df1;
  ASSERT_GT(h.n_second, 300);
  auto [c2, df2] = chi_square(h.second, p2, h.n_second);
  ASSERT_GE(df2, 5);
  EXPECT_LT(c2, chi_critical(df2)) << "second token, df " << df2 << ", " << h.n_second << " runs";
}

// ops::sampling_candidates is the distribution the sample op draws from:
// walking its candidates with the op's uniform draw picks the op's token,
// for many settings and seeds, penalties and bans included.
TEST(SpeculativeSampled, CandidatesAreWhatTheSamplerDrawsFrom) {
  Stream s(Device::CPU);
  std::mt19937 g(3);
  std::normal_distribution<float> n(0.0f, 2.0f);
  const int V = 300;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<float> l(V);
    for (auto& x : l) x = n(g);
    std::vector<uint8_t> seen(V, 0);
    for (int i = 0; i < 40; ++i) seen[g() % V] = 1;
    const std::vector<int32_t> banned = {int32_t(g() % V), int32_t(g() % V)};
    ops::SamplingParams p{.temperature = trial % 4 == 0 ? 0.0f : 0.3f + float(trial % 7) * 0.4f,
                          .top_k = trial % 3 == 0 ? 0 : int(g() % 50) + 1,
                          .top_p = trial % 5 == 0 ? 1.0f : 0.5f + 0.1f * float(trial % 5),
                          .repetition_penalty = trial % 2 ? 1.0f : 1.4f,
                          .seed = uint64_t(trial)};
    const ops::SampleCandidates c = ops::sampling_candidates(l.data(), V, p, banned.data(), 2, seen.data());
    ASSERT_TRUE(c.finite);
    Tensor logits = Tensor::from_host(l.data(), {V}, DType::F32, Device::CPU);
    Tensor config = Tensor::from_host(&p, {int64_t(sizeof(p))}, DType::U8, Device::CPU);
    Tensor ban = Tensor::from_host(banned.data(), {2}, DType::I32, Device::CPU);
    Tensor seen_t = Tensor::from_host(seen.data(), {V}, DType::U8, Device::CPU);
    const int32_t pos = trial * 13;
    Tensor pos_t = Tensor::from_host(&pos, {1}, DType::I32, Device::CPU);
    Tensor tok = Tensor::zeros({1}, DType::I32, Device::CPU);
    ops::sample(s, logits, config, ban, 2, seen_t, pos_t, tok);
    int32_t op = -1;
    tok.copy_to_host(&op);
    const float u = uniform01(p.seed, pos) * c.sum;
    float acc = 0.0f;
    int32_t walked = c.ids.back();
    for (size_t i = 0; i < c.ids.size(); ++i)
      if (u < (acc += c.weights[i])) {
        walked = c.ids[i];
        break;
      }
    ASSERT_EQ(op, p.temperature > 0 ? walked : c.ids[0]) << "trial " << trial;
    for (size_t i = 0; i < c.ids.size(); ++i)  // a banned id weighs nothing (it may stay in the list at 0)
      if (c.ids[i] == banned[0] || c.ids[i] == banned[1]) EXPECT_EQ(c.weights[i], 0.0f);
  }
}
