// ops::check / ops::validate (the ranges of SamplingParams) and Session's
// use of them: a bad setting is an Error naming it, raised before anything
// is written to the cache.
#include <cmath>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/session.h"

using namespace kvgraph;
using ::testing::HasSubstr;

namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::string field_of(const ops::SamplingParams& p) {
  auto issue = ops::check(p);
  return issue ? issue->field : "";
}

}  // namespace

TEST(SamplingParams, DefaultsGreedyAndTypicalSettingsAreValid) {
  EXPECT_FALSE(ops::check({}));
  EXPECT_FALSE(ops::check({.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .repetition_penalty = 1.0f}));
  EXPECT_FALSE(ops::check({.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.1f}));
  EXPECT_FALSE(ops::check({.temperature = 2.0f, .top_p = 1e-6f, .repetition_penalty = 0.5f, .seed = ~0ull}));
  EXPECT_NO_THROW(ops::validate({}));
}

TEST(SamplingParams, OutOfRangeSettingsAreNamed) {
  EXPECT_EQ(field_of({.temperature = kNan}), "temperature");
  EXPECT_EQ(field_of({.temperature = -1.0f}), "temperature");
  EXPECT_EQ(field_of({.temperature = kInf}), "temperature");
  EXPECT_EQ(field_of({.top_k = -3}), "top_k");
  EXPECT_EQ(field_of({.top_p = 1.5f}), "top_p");
  EXPECT_EQ(field_of({.top_p = 0.0f}), "top_p");
  EXPECT_EQ(field_of({.top_p = kNan}), "top_p");
  EXPECT_EQ(field_of({.repetition_penalty = 0.0f}), "repetition_penalty");
  EXPECT_EQ(field_of({.repetition_penalty = -1.0f}), "repetition_penalty");
  EXPECT_EQ(field_of({.repetition_penalty = kNan}), "repetition_penalty");
  try {
    ops::validate({.top_p = 1.5f});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[sampling] top_p 1.5: expected a number in (0, 1]");
  }
}

TEST(SamplingParams, SessionRejectsBadSettingsBeforeWritingTheCache) {
  auto model = Model::load(std::filesystem::path(KVGRAPH_SOURCE_DIR) / "models" / "default", Device::CPU);
  Session s(model, {.capacity = 32});
  const std::vector<int32_t> prompt{1, 2, 3};
  s.sampling().top_p = kNan;
  try {
    s.generate(prompt, nullptr, {.max_tokens = 2});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[sampling] top_p nan"));
  }
  EXPECT_EQ(s.position(), 0);
  s.sampling().top_p = 1.0f;
  s.prefill(prompt);
  s.sampling().repetition_penalty = 0.0f;
  EXPECT_THROW(s.sample(), Error);
  s.sampling().repetition_penalty = 1.0f;
  EXPECT_NO_THROW(s.sample());
  s.sampling().temperature = -1.0f;
  EXPECT_THROW(s.decode(), Error);
}
