// The cache lifecycle on the GPU (compiled decode, every family fixture):
// rollback after rings wrapped, fork and save/restore continue bitwise as the
// original session would, and prefix reuse equals a fresh prefill. The CPU
// suite proves the semantics (session_rollback_test, session_file_test,
// session_prefix_reuse_test); this checks that KV bytes and step state move
// the same way through device memory. Skips without a device.
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "support/fixtures.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using namespace kvgraph::testing;

namespace {

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  bool operator==(const Trace& o) const {
    if (tokens != o.tokens || logits.size() != o.logits.size()) return false;
    for (size_t i = 0; i < logits.size(); ++i)
      if (logits[i].size() != o.logits[i].size() ||
          std::memcmp(logits[i].data(), o.logits[i].data(), logits[i].size() * sizeof(float)) != 0)
        return false;
    return true;
  }
};

Trace decode(Session& s, int m) {
  Trace t;
  for (int i = 0; i < m; ++i) {
    t.tokens.push_back(s.decode());
    t.logits.push_back(s.last_logits());
  }
  return t;
}

ops::SamplingParams seeded() {
  ops::SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.repetition_penalty = 1.3f;
  p.seed = 11;
  return p;
}

// Two sessions of capacity 200 (steps of up to 4 tokens) on the family's
// CUDA model, brought to the same state: the seeded sampler, the greedy
// prompt and `decodes` decode steps.
struct Pair {
  std::shared_ptr<const Model> gpu;
  Session a, b;
  Pair(const std::string& family, int decodes)
      : gpu(Model::load(fixtures_dir() / family, Device::CUDA)), a(gpu, options()), b(gpu, options()) {
    const Reference ref = load_reference(family);
    for (Session* s : {&a, &b}) {
      s->sampling() = seeded();
      s->prefill(ref.greedy_prompt);
      s->sample();
      decode(*s, decodes);
    }
  }
  static SessionOptions options() {
    SessionOptions so;
    so.capacity = 200;
    so.max_write = 4;
    return so;
  }
};

class CudaLifecycle : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

}  // namespace

TEST_P(CudaLifecycle, RollbackForkAndRestoreContinueBitwise) {
  Pair p(GetParam(), 60);  // rings (window 12, pool 15) wrap several times
  auto& [gpu, a, b] = p;
  const SessionOptions so = Pair::options();
  const int32_t n0 = a.position();
  const int32_t p0 = *a.pending();

  // Rollback of max_write - 1 decoded tokens, in place.
  decode(a, 3);
  const Session::TrimResult tr = a.trim(n0);
  EXPECT_EQ(tr.reprefilled, 0);
  a.set_pending(p0);

  // Fork and save before either continues; restore into a fresh session.
  TempDir dir;
  auto f = a.fork();
  a.save(dir.path() / "a.kvs");
  Session r(gpu, so);
  r.sampling() = seeded();  // sampling settings are the caller's, not the file's (as on the CPU)
  r.restore(dir.path() / "a.kvs");

  const Trace want = decode(b, 20);
  EXPECT_TRUE(decode(a, 20) == want) << GetParam() << ": after rollback";
  EXPECT_TRUE(decode(*f, 20) == want) << GetParam() << ": the fork";
  EXPECT_TRUE(decode(r, 20) == want) << GetParam() << ": restored";
}

TEST_P(CudaLifecycle, PrefixReuseEqualsAFreshPrefill) {
  const Reference ref = load_reference(GetParam());
  auto gpu = Model::load(fixtures_dir() / GetParam(), Device::CUDA);
  SessionOptions so;
  so.capacity = 96;
  so.max_write = 4;
  std::vector<int32_t> first(ref.ids.begin(), ref.ids.begin() + 21), second(ref.ids.begin(), ref.ids.begin() + 37);
  Session a(gpu, so), fresh(gpu, so);
  a.prefill(first);
  const auto reuse = a.prefill_reusing(second);
  EXPECT_GT(reuse.reused, 0) << GetParam();
  fresh.prefill(second);
  const int32_t t = a.sample();
  EXPECT_EQ(t, fresh.sample()) << GetParam();
  const std::vector<float> la = a.last_logits(), lf = fresh.last_logits();
  ASSERT_EQ(la.size(), lf.size());
  EXPECT_EQ(0, std::memcmp(la.data(), lf.data(), la.size() * sizeof(float))) << GetParam();
  EXPECT_TRUE(decode(a, 10) == decode(fresh, 10)) << GetParam();
}

// An error in the middle of recording (the step's graph capture): the
// capture is ended and dropped, and the session records again and continues
// exactly as one that never failed.
TEST_P(CudaLifecycle, FailedRecordingIsDroppedAndTheSessionContinues) {
  Pair p(GetParam(), 0);
  auto& [gpu, a, b] = p;
  int left = 2;
  a.set_fault_injection([&left](std::string_view p) {
    if (p == "decode:while_recording" && left-- > 0) throw std::runtime_error("injected");
  });
  for (int i = 0; i < 2; ++i) EXPECT_THROW(a.decode(), std::runtime_error);
  a.set_fault_injection({});
  EXPECT_TRUE(decode(a, 30) == decode(b, 30)) << GetParam();
  EXPECT_EQ(a.captures(), 1);
}

// Sessions on several threads at once, each creating its buffers (synchronous
// uploads, frees) while others record their graphs: every one decodes as it
// does alone (a capture on one thread must not be broken by another's
// synchronous copy: see cuda::CaptureExclusion).
TEST(CudaThreads, SessionsOnSeveralThreadsRecordAndDecodeAsAlone) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Reference ref = load_reference("gemma3");
  auto gpu = Model::load(fixtures_dir() / "gemma3", Device::CUDA);
  constexpr int kThreads = 4;
  auto run = [&](int i) {
    SessionOptions so;
    so.capacity = 160;
    so.max_write = 4 + i % 2;
    Session s(gpu, so);
    s.sampling() = seeded();
    s.sampling().seed = 100 + i;
    s.prefill(ref.greedy_prompt);
    s.sample();
    Trace t = decode(s, 20);
    { Session scratch(gpu, so); }  // buffers made and freed while others replay or record
    s.set_banned_tokens({gpu->config().vocab_size - 1});  // records the step again, while the others run
    Trace more = decode(s, 20);
    t.tokens.insert(t.tokens.end(), more.tokens.begin(), more.tokens.end());
    t.logits.insert(t.logits.end(), more.logits.begin(), more.logits.end());
    return t;
  };
  std::vector<Trace> alone;
  for (int i = 0; i < kThreads; ++i) alone.push_back(run(i));
  for (int round = 0; round < 3; ++round) {
    std::vector<Trace> got(kThreads);
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
      threads.emplace_back([&, i] {
        try {
          got[i] = run(i);
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    for (auto& th : threads) th.join();
    for (int i = 0; i < kThreads; ++i) {
      EXPECT_EQ(errors[i], "") << "round " << round << " thread " << i;
      EXPECT_TRUE(got[i] == alone[i]) << "round " << round << " thread " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaLifecycle, ::testing::ValuesIn(fixture_families()),
                         [](const auto& info) { return info.param; });
