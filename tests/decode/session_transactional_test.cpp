// A step that fails (a full cache, a bad token id, a device error injected
// after the step's kernels ran) leaves the cache, the step state and the
// recorded step as before: continuing gives bitwise the tokens and logits of
// a session where the failure never happened.
#include <cstring>
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

struct DeviceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws at the given fault point the first `times` times it is reached.
Session::FaultFn fail_at(std::string point, int times = 1) {
  auto left = std::make_shared<int>(times);
  return [point, left](std::string_view p) {
    if (p == point && (*left)-- > 0) throw DeviceError("injected device error at " + point);
  };
}

std::vector<float> run_on(Session& s, int n, std::vector<int32_t>* tokens) {
  std::vector<float> logits;
  for (int i = 0; i < n; ++i) {
    tokens->push_back(s.decode());
    auto l = s.last_logits();
    logits.insert(logits.end(), l.begin(), l.end());
  }
  return logits;
}

void expect_same_future(Session& a, Session& b, int n) {
  std::vector<int32_t> ta, tb;
  auto la = run_on(a, n, &ta);
  auto lb = run_on(b, n, &tb);
  EXPECT_EQ(ta, tb);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << "logits differ";
}

ops::SamplingParams seeded() {
  ops::SamplingParams p;
  p.temperature = 0.8f;
  p.repetition_penalty = 1.2f;
  p.seed = 42;
  return p;
}

// Two sessions brought to the same state: the seeded sampler, the greedy
// prompt, and `decodes` decode steps.
void same_start(Session& a, Session& b, const Reference& ref, int decodes) {
  for (Session* s : {&a, &b}) {
    s->sampling() = seeded();
    s->prefill(ref.greedy_prompt);
    s->sample();
    for (int i = 0; i < decodes; ++i) s->decode();
  }
}

class SessionTransactional : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

}  // namespace

TEST_P(SessionTransactional, FailedDecodeStepLeavesEverythingAsBefore) {
  const auto& [family, eager] = GetParam();
  const Reference ref = load_reference(family);
  SessionOptions so{.capacity = 200, .max_write = 4, .eager = eager};
  Session a(fixture(family), so), b(fixture(family), so);
  same_start(a, b, ref, 40);  // rings wrap
  const int captures = a.captures();
  const int32_t L = a.position();
  const auto pending = a.pending();
  a.set_fault_injection(fail_at("decode:after_step", 3));
  for (int i = 0; i < 3; ++i) EXPECT_THROW(a.decode(), DeviceError);
  EXPECT_EQ(a.position(), L);
  EXPECT_EQ(a.pending(), pending);
  EXPECT_EQ(a.tokens(), b.tokens());
  EXPECT_EQ(a.captures(), captures) << "the recorded step is kept";
  a.set_fault_injection({});
  expect_same_future(a, b, 12);
  EXPECT_EQ(a.captures(), captures);
}

// An error in the middle of recording the decode step (or a verify step):
// the recording is dropped, the stream leaves recording mode, and the next
// calls record again and continue exactly as a session that never failed.
class SessionRecording : public ::testing::TestWithParam<std::string> {};

TEST_P(SessionRecording, FailedRecordingLeavesEverythingAsBefore) {
  const std::string& family = GetParam();
  const Reference ref = load_reference(family);
  SessionOptions so{.capacity = 200, .max_write = 4};
  Session a(fixture(family), so), b(fixture(family), so);
  same_start(a, b, ref, 0);
  const auto pending = a.pending();
  a.set_fault_injection(fail_at("decode:while_recording", 2));
  for (int i = 0; i < 2; ++i) EXPECT_THROW(a.decode(), DeviceError);
  EXPECT_EQ(a.captures(), 0) << "no recording was kept";
  EXPECT_EQ(a.pending(), pending);
  a.set_fault_injection({});
  expect_same_future(a, b, 8);
  EXPECT_EQ(a.captures(), 1);
  // A verify step of 3 tokens, failing while it records, then run for real.
  const std::vector<int32_t> proposals = {1, 2};
  a.set_fault_injection(fail_at("verify:while_recording"));
  EXPECT_THROW(a.verify(proposals), DeviceError);
  a.set_fault_injection({});
  const std::vector<int32_t> va = a.verify(proposals), vb = b.verify(proposals);
  EXPECT_EQ(va, vb);
  a.accept(0, va[0]);
  b.accept(0, vb[0]);
  expect_same_future(a, b, 4);
}

TEST_P(SessionTransactional, FailedDecodeManyAndPrefillChunkLeaveEverythingAsBefore) {
  const auto& [family, eager] = GetParam();
  const Reference ref = load_reference(family);
  SessionOptions so{.capacity = 200, .max_write = 4, .eager = eager};
  Session a(fixture(family), so), b(fixture(family), so);
  same_start(a, b, ref, 30);
  a.set_fault_injection(fail_at("decode:after_step"));
  EXPECT_THROW(a.decode_many(5), DeviceError);
  // A long prefill (it wraps the rings: rows the rollback needs are
  // overwritten) failing in its third chunk, then a short one failing at once.
  const std::vector<int32_t> more(ref.ids.begin(), ref.ids.begin() + 30);
  a.set_fault_injection([n = 0](std::string_view p) mutable {
    if (p == "prefill:after_chunk" && ++n == 3) throw DeviceError("third chunk");
  });
  EXPECT_THROW(a.prefill(more), DeviceError);
  a.set_fault_injection(fail_at("prefill:after_chunk"));
  EXPECT_THROW(a.prefill(std::vector<int32_t>{1, 2}), DeviceError);
  a.set_fault_injection({});
  EXPECT_EQ(a.position(), b.position());
  EXPECT_EQ(a.pending(), b.pending());
  EXPECT_EQ(a.tokens(), b.tokens());
  expect_same_future(a, b, 12);
  // And the prefill that failed, done now, agrees too.
  a.prefill(more);
  b.prefill(more);
  a.sample();
  b.sample();
  expect_same_future(a, b, 6);
}

TEST_P(SessionTransactional, FullCacheAndBadTokenIdsWriteNothing) {
  const auto& [family, eager] = GetParam();
  const Reference ref = load_reference(family);
  SessionOptions so{.capacity = 40, .max_write = 4, .eager = eager};
  Session a(fixture(family), so), b(fixture(family), so);
  same_start(a, b, ref, 10);
  const int V = fixture(family)->config().vocab_size;
  EXPECT_THROW(a.prefill(std::vector<int32_t>{1, 2, V, 3}), Error);
  EXPECT_THROW(a.prefill(std::vector<int32_t>{1, -1}), Error);
  if (a.capacity() < 1000) EXPECT_THROW(a.prefill(std::vector<int32_t>(a.capacity(), 1)), CacheFull);
  EXPECT_THROW(a.set_pending(V), Error);
  EXPECT_EQ(a.tokens(), b.tokens());
  EXPECT_EQ(a.pending(), b.pending());
  expect_same_future(a, b, 8);
}

INSTANTIATE_TEST_SUITE_P(Families, SessionTransactional,
                         ::testing::Combine(::testing::Values("mistral", "gemma3", "llama"), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_eager" : "_compiled");
                         });
// (Eager sessions record nothing: compiled only.)
INSTANTIATE_TEST_SUITE_P(Families, SessionRecording, ::testing::Values("mistral", "gemma3", "llama"),
                         [](const auto& info) { return info.param; });
