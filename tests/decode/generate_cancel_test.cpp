// GenerateOptions::cancel: a flag polled after each token (chat sets it from
// SIGINT) ends generation with FinishReason::cancelled, keeping the tokens
// so far and leaving the session ready to continue.
#include <atomic>

#include <gtest/gtest.h>

#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "kvgraph/tokenizer.h"

using namespace kvgraph;

namespace {

std::filesystem::path default_dir() { return std::filesystem::path(KVGRAPH_SOURCE_DIR) / "models" / "default"; }

struct Fixture {
  std::shared_ptr<Model> model = Model::load(default_dir(), Device::CPU);
  Tokenizer tok = Tokenizer::from_file(default_dir());
  // Greedy, this prompt repeats "la" without an end token for hundreds of tokens.
  std::vector<int32_t> prompt = tok.encode("la la la la la la la la");
};

Fixture& fx() {
  static Fixture f;
  return f;
}

}  // namespace

TEST(GenerateCancel, EndsAfterTheTokenThatSawTheFlag) {
  Session ref_s(fx().model, {.capacity = 128});
  ref_s.sampling().temperature = 0;
  GenerateResult ref = ref_s.generate(fx().prompt, &fx().tok, {.max_tokens = 12});
  ASSERT_EQ(ref.finish, FinishReason::max_tokens);

  std::atomic<bool> cancel{false};
  Session s(fx().model, {.capacity = 128});
  s.sampling().temperature = 0;
  int seen = 0;
  GenerateResult r = s.generate(fx().prompt, &fx().tok, {.max_tokens = 12, .cancel = &cancel},
                                [&](int32_t id, std::string_view) {
                                  if (id >= 0 && ++seen == 5) cancel = true;
                                });
  EXPECT_EQ(r.finish, FinishReason::cancelled);
  EXPECT_STREQ(finish_reason_name(r.finish), "cancelled");
  EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + 5));
  EXPECT_EQ(r.last, ref.tokens[4]);
  // The last token is pending, as after any finish: feeding it continues the reference.
  EXPECT_EQ(s.position(), static_cast<int32_t>(fx().prompt.size()) + 4);
  cancel = false;
  GenerateResult more = s.generate(std::vector<int32_t>{r.last}, &fx().tok, {.max_tokens = 7, .cancel = &cancel});
  EXPECT_EQ(more.tokens, std::vector<int32_t>(ref.tokens.begin() + 5, ref.tokens.end()));
}

TEST(GenerateCancel, AFlagAlreadySetGivesOneToken) {
  std::atomic<bool> cancel{true};
  Session s(fx().model, {.capacity = 128});
  s.sampling().temperature = 0;
  GenerateResult r = s.generate(fx().prompt, &fx().tok, {.max_tokens = 12, .cancel = &cancel});
  EXPECT_EQ(r.finish, FinishReason::cancelled);
  EXPECT_EQ(r.tokens.size(), 1u);
  EXPECT_EQ(s.position(), static_cast<int32_t>(fx().prompt.size()));
}
