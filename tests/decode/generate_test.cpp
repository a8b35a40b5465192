// Session::generate against the plain prefill/sample/decode loop on the
// embedded default model (greedy, CPU): it must return exactly the loop's
// tokens, cut where each finish reason says, and stream exactly its text.
#include <algorithm>
#include <climits>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "kvgraph/tokenizer.h"

using namespace kvgraph;

namespace {

std::filesystem::path default_dir() { return std::filesystem::path(KVGRAPH_SOURCE_DIR) / "models" / "default"; }

struct Fixture {
  std::shared_ptr<Model> model = Model::load(default_dir(), Device::CPU);
  Tokenizer tok = Tokenizer::from_file(default_dir());
  int32_t eos = *tok.eos_id();
};

Fixture& fx() {
  static Fixture f;
  return f;
}

// The reference: `n` greedy tokens from the primitive loop, EOS included
// (nothing banned, nothing stops it).
std::vector<int32_t> greedy_loop(const std::vector<int32_t>& prompt, int n) {
  Session s(fx().model, {.capacity = 256});
  s.prefill(prompt);
  std::vector<int32_t> out{s.sample()};
  while (static_cast<int>(out.size()) < n) out.push_back(s.decode());
  return out;
}

struct Streamed {
  std::vector<int32_t> ids;
  std::string text;
  TokenFn fn() {
    return [this](int32_t id, std::string_view piece) {
      if (id >= 0) ids.push_back(id);
      text += piece;
    };
  }
};

// A prompt whose greedy continuation ends with EOS within 64 tokens, and
// where that is (found once, from the reference loop only).
struct EosCase {
  std::vector<int32_t> prompt, ref;  // ref: the loop's tokens, EOS last
};

const EosCase& eos_case() {
  static const EosCase c = [] {
    for (const char* p : {"Once upon a time", "The meaning of life is", "A computer is", "Hello"}) {
      EosCase e{fx().tok.encode(p), {}};
      e.ref = greedy_loop(e.prompt, 64);
      auto at = std::find(e.ref.begin(), e.ref.end(), fx().eos);
      if (at - e.ref.begin() >= 12) {
        e.ref.erase(at + 1, e.ref.end());
        return e;
      }
    }
    throw std::runtime_error("no test prompt reaches EOS after 12..64 greedy tokens");
  }();
  return c;
}

}  // namespace

TEST(Generate, EndsAtEosWithoutIt) {
  const EosCase& c = eos_case();
  Session s(fx().model, {.capacity = 256});
  Streamed st;
  GenerateResult r = s.generate(c.prompt, &fx().tok, {.max_tokens = 64}, st.fn());
  EXPECT_EQ(r.finish, FinishReason::eos);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(c.ref.begin(), c.ref.end() - 1));
  EXPECT_EQ(r.last, fx().eos);
  EXPECT_EQ(r.text, fx().tok.decode(r.tokens, true));
  EXPECT_EQ(st.ids, r.tokens);
  EXPECT_EQ(st.text, r.text);
  // The EOS was sampled but not fed: the cache holds the prompt and every token but the last.
  EXPECT_EQ(s.position(), static_cast<int32_t>(c.prompt.size() + r.tokens.size()));
}

TEST(Generate, IgnoreEosRunsPastIt) {
  const EosCase& c = eos_case();
  Session s(fx().model, {.capacity = 256});
  const int n = static_cast<int>(c.ref.size()) + 8;
  GenerateResult r = s.generate(c.prompt, &fx().tok, {.max_tokens = n, .ignore_eos = true});
  EXPECT_EQ(r.finish, FinishReason::max_tokens);
  ASSERT_EQ(static_cast<int>(r.tokens.size()), n);
  EXPECT_EQ(std::count(r.tokens.begin(), r.tokens.end(), fx().eos), 0);
  // Banning EOS changes nothing before the step where it was the arg-max.
  EXPECT_EQ(std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + c.ref.size() - 1),
            std::vector<int32_t>(c.ref.begin(), c.ref.end() - 1));
}

TEST(Generate, StopsAtMaxTokens) {
  const EosCase& c = eos_case();
  Session s(fx().model, {.capacity = 256});
  Streamed st;
  GenerateResult r = s.generate(c.prompt, &fx().tok, {.max_tokens = 5}, st.fn());
  EXPECT_EQ(r.finish, FinishReason::max_tokens);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(c.ref.begin(), c.ref.begin() + 5));
  EXPECT_EQ(r.last, r.tokens.back());
  EXPECT_EQ(st.text, r.text);
  EXPECT_EQ(r.text, fx().tok.decode(r.tokens, true));
}

TEST(Generate, StopStringCutsTheTextBeforeIt) {
  const EosCase& c = eos_case();
  const std::vector<int32_t> body(c.ref.begin(), c.ref.end() - 1);
  const std::string full = fx().tok.decode(body, true);
  // A stop string from the middle of the unconstrained text; it ends the
  // text at its first occurrence, which may come earlier.
  const std::string stop = full.substr(full.size() / 2, 3);
  const size_t cut = full.find(stop);
  ASSERT_GT(cut, 0u) << full;

  Session s(fx().model, {.capacity = 256});
  Streamed st;
  GenerateResult r = s.generate(c.prompt, &fx().tok, {.max_tokens = 64, .stop = {"never appears \x01", stop}}, st.fn());
  EXPECT_EQ(r.finish, FinishReason::stop);
  EXPECT_EQ(r.text, full.substr(0, cut));
  EXPECT_EQ(st.text, r.text) << "the stream must not show the stop string";
  // The tokens are the reference's up to the one that completed the stop string.
  ASSERT_LE(r.tokens.size(), body.size());
  EXPECT_EQ(r.tokens, std::vector<int32_t>(body.begin(), body.begin() + r.tokens.size()));
  EXPECT_NE(fx().tok.decode(r.tokens, true).find(stop), std::string::npos);
  const std::vector<int32_t> one_less(r.tokens.begin(), r.tokens.end() - 1);
  EXPECT_EQ(fx().tok.decode(one_less, true).find(stop), std::string::npos);
}

TEST(Generate, StopStringInBytesHeldToTheEndIsCutToo) {
  // A byte-level tokenizer in which the model's first greedy token is the
  // byte 0xE2 alone (U+00E2 in GPT-2's byte alphabet): the first byte of a
  // 3-byte character, held by the stream decoder until the end, where it is
  // flushed as U+FFFD. A stop string matching that flushed text must be cut
  // like any other (it was returned and streamed).
  const EosCase& c = eos_case();
  const int32_t first = c.ref[0];
  nlohmann::json j;
  j["model"] = {{"type", "BPE"}, {"vocab", {{"\xC3\xA2", first}}}, {"merges", nlohmann::json::array()}};
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  const Tokenizer bytes = Tokenizer::from_json(j.dump());
  const std::string replacement = "\xEF\xBF\xBD";  // U+FFFD
  {
    StreamDecoder sd(bytes);
    ASSERT_EQ(sd.step(first), "");
    ASSERT_EQ(sd.flush(), replacement) << "the premise of this test";
  }
  Session s(fx().model, {.capacity = 256});
  Streamed st;
  GenerateResult r = s.generate(c.prompt, &bytes, {.max_tokens = 1, .stop = {replacement}}, st.fn());
  EXPECT_EQ(r.finish, FinishReason::stop);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(st.text, "");
  EXPECT_EQ(r.tokens, std::vector<int32_t>{first});
}

TEST(Generate, FullCacheFinishesWithLength) {
  const EosCase& c = eos_case();
  const int32_t cap = static_cast<int32_t>(c.prompt.size()) + 3;
  Session s(fx().model, {.capacity = cap});
  GenerateResult r = s.generate(c.prompt, &fx().tok, {.max_tokens = 50});
  EXPECT_EQ(r.finish, FinishReason::length);
  // prompt + 3 decodes fill the cache; the 4th token is sampled, not fed.
  EXPECT_EQ(r.tokens, std::vector<int32_t>(c.ref.begin(), c.ref.begin() + 4));
  EXPECT_EQ(s.position(), s.capacity());
}

TEST(Generate, LastTokenContinuesTheSequence) {
  // Two generate calls, the second fed the first's `last`, equal one run.
  const EosCase& c = eos_case();
  Session s(fx().model, {.capacity = 256});
  GenerateResult a = s.generate(c.prompt, &fx().tok, {.max_tokens = 4});
  GenerateResult b = s.generate(std::vector<int32_t>{a.last}, &fx().tok, {.max_tokens = 4});
  EXPECT_EQ(b.tokens, std::vector<int32_t>(c.ref.begin() + 4, c.ref.begin() + 8));
}

TEST(Generate, WithoutTokenizerReturnsIdsAndRejectsStopStrings) {
  const EosCase& c = eos_case();
  Session s(fx().model, {.capacity = 256});
  GenerateResult r = s.generate(c.prompt, nullptr, {.max_tokens = 3});
  EXPECT_EQ(r.tokens, std::vector<int32_t>(c.ref.begin(), c.ref.begin() + 3));
  EXPECT_TRUE(r.text.empty());
  Session s2(fx().model, {.capacity = 256});
  EXPECT_THROW(s2.generate(c.prompt, nullptr, {.max_tokens = 3, .stop = {"x"}}), Error);
  EXPECT_THROW(s2.generate(c.prompt, &fx().tok, {.max_tokens = 0}), Error);
}

TEST(RequestCapacity, PromptPlusNewTokensCappedByTheModel) {
  ModelConfig cfg;
  cfg.max_position_embeddings = 1024;
  EXPECT_EQ(request_capacity(cfg, 10, 20), 30);
  EXPECT_EQ(request_capacity(cfg, 10, 5000), 1024);
  cfg.max_position_embeddings = 0;  // unknown: no cap but int32
  EXPECT_EQ(request_capacity(cfg, INT32_MAX, INT32_MAX), INT32_MAX);
  EXPECT_EQ(request_capacity(cfg, 100, 28), 128);
}
