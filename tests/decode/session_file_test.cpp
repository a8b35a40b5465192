// Fork and save/restore: an independent deep copy; a versioned, checksummed
// file that restores bitwise the same future, and every corruption of it
// (truncation anywhere, a flipped byte, another model, version or storage
// dtype) refused with one clear error and the session untouched.
#include <cstring>
#include <fstream>
#include <map>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "support/fixtures.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;

namespace {

std::shared_ptr<const Model> fixture(const std::string& family) {
  static std::map<std::string, std::shared_ptr<const Model>> models;
  auto& m = models[family];
  if (!m) m = Model::load(fixtures_dir() / family, Device::CPU);
  return m;
}

struct Future {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  bool operator==(const Future& o) const {
    return tokens == o.tokens && logits.size() == o.logits.size() &&
           std::memcmp(logits.data(), o.logits.data(), logits.size() * sizeof(float)) == 0;
  }
};

Future future(Session& s, int n) {
  Future f;
  for (int i = 0; i < n; ++i) {
    f.tokens.push_back(s.decode());
    auto l = s.last_logits();
    f.logits.insert(f.logits.end(), l.begin(), l.end());
  }
  return f;
}

ops::SamplingParams seeded(uint64_t seed) {
  ops::SamplingParams p;
  p.temperature = 0.8f;
  p.repetition_penalty = 1.2f;
  p.seed = seed;
  return p;
}

// A session of `family` after a prompt and `steps` decode steps (rings wrap).
void warm(Session& s, const std::string& family, int steps, uint64_t seed = 7) {
  s.sampling() = seeded(seed);
  s.prefill(load_reference(family).greedy_prompt);
  s.sample();
  for (int i = 0; i < steps; ++i) s.decode();
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

class SessionFileFamilies : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(SessionFileFamilies, ForkIsIndependentAndContinuesLikeTheOriginal) {
  const std::string family = GetParam();
  SessionOptions so{.capacity = 160, .max_write = 4};
  Session a(fixture(family), so), twin(fixture(family), so), twin2(fixture(family), so);
  for (Session* s : {&a, &twin, &twin2}) warm(*s, family, 30);
  auto f1 = a.fork();
  auto f2 = a.fork();
  // The fork continues as the original would.
  EXPECT_EQ(future(*f1, 10), future(twin, 10));
  // Changing a fork (other settings, a rollback, more tokens) leaves the original alone.
  f2->sampling() = seeded(99);
  future(*f2, 7);
  f2->trim(f2->position() - 3);
  f2->prefill(std::vector<int32_t>{3, 4, 5});
  EXPECT_EQ(future(a, 10), future(twin2, 10)) << "the original after its forks were used";
}

TEST_P(SessionFileFamilies, SaveRestoreContinuesBitwiseInF32AndBf16) {
  const std::string family = GetParam();
  TempDir dir;
  for (DType storage : {DType::F32, DType::BF16}) {
    SessionOptions so{.capacity = 160, .max_write = 4, .kv_storage = storage};
    Session a(fixture(family), so);
    warm(a, family, 45);
    a.trim(a.position() - 2);  // a pending token from the history, a high-water mark past the length
    const auto path = dir.path() / "s.kvs";
    a.save(path);
    EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp" + std::to_string(getpid())));
    SessionOptions bigger = so;
    bigger.capacity = 200;  // flat layers may change capacity
    Session b(fixture(family), family == "mistral" || family == "llama" ? bigger : so);
    b.sampling() = seeded(7);
    b.restore(path);
    EXPECT_EQ(b.tokens(), a.tokens());
    EXPECT_EQ(b.pending(), a.pending());
    EXPECT_EQ(future(b, 12), future(a, 12)) << dtype_name(storage);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, SessionFileFamilies, ::testing::Values("mistral", "gemma3", "llama", "qwen2"),
                         [](const auto& info) { return info.param; });

TEST(SessionFile, SavedLogitsLetARestoredSessionSample) {
  TempDir dir;
  SessionOptions so{.capacity = 64, .max_write = 4};
  Session a(fixture("gemma2"), so), b(fixture("gemma2"), so);
  a.sampling() = b.sampling() = seeded(3);
  a.prefill(load_reference("gemma2").greedy_prompt);
  a.save(dir.path() / "p.kvs");
  b.restore(dir.path() / "p.kvs");
  EXPECT_EQ(b.sample(), a.sample());
  EXPECT_EQ(future(b, 5), future(a, 5));
}

// Every corruption is refused with one "[session_file]" error, and the
// session that tried continues exactly as its twin that never did.
TEST(SessionFile, EveryCorruptionIsRefusedAndTheSessionIsUntouched) {
  TempDir dir;
  const std::string family = "gemma3";  // ring and flat layers
  SessionOptions so{.capacity = 96, .max_write = 4};
  Session src(fixture(family), so);
  warm(src, family, 40, 1);
  const auto good = dir.path() / "good.kvs";
  src.save(good);
  const std::string bytes = slurp(good);

  Session s(fixture(family), so), twin(fixture(family), so);
  warm(s, family, 20, 5);
  warm(twin, family, 20, 5);
  const auto bad = dir.path() / "bad.kvs";
  int refused = 0;
  auto expect_refused = [&](const std::string& content, const std::string& what, const std::string& message = "") {
    write(bad, content);
    try {
      s.restore(bad);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("[session_file]")) << what;
      if (!message.empty()) EXPECT_THAT(e.what(), HasSubstr(message)) << what;
      ++refused;
    }
  };
  // Truncated: at every length up to 256 bytes (magic, version, the header
  // section), then every 61st, and one byte short.
  for (size_t n = 0; n < bytes.size(); n += n < 256 ? 1 : 211) expect_refused(bytes.substr(0, n), "truncated at " + std::to_string(n));
  expect_refused(bytes.substr(0, bytes.size() - 1), "one byte short");
  expect_refused(bytes + "x", "a byte too many");
  // One flipped bit anywhere: every byte of the first 256, then every 37th.
  for (size_t i = 0; i < bytes.size(); i += i < 256 ? 1 : 101) {
    std::string c = bytes;
    c[i] ^= 0x10;
    expect_refused(c, "bit flipped at " + std::to_string(i));
  }
  // Another format version (the version word follows the 8-byte magic).
  std::string v2 = bytes;
  v2[8] = 2;
  expect_refused(v2, "version 2", "format version 2 is not supported");
  expect_refused(std::string("GGUF") + bytes.substr(4), "another magic", "not a kvgraph session file");
  // Another model, another storage dtype, another layout (max_write).
  Session other(fixture("qwen3"), {.capacity = 96, .max_write = 4});
  other.prefill(std::vector<int32_t>{1, 2, 3});
  other.save(dir.path() / "qwen3.kvs");
  expect_refused(slurp(dir.path() / "qwen3.kvs"), "another model", "another model");
  Session bf16(fixture(family), {.capacity = 96, .max_write = 4, .kv_storage = DType::BF16});
  bf16.prefill(std::vector<int32_t>{1, 2, 3});
  bf16.save(dir.path() / "bf16.kvs");
  expect_refused(slurp(dir.path() / "bf16.kvs"), "bf16 storage", "holds a bf16 cache; this session stores f32");
  Session mw8(fixture(family), {.capacity = 96, .max_write = 8});
  mw8.prefill(std::vector<int32_t>{1, 2, 3});
  mw8.save(dir.path() / "mw8.kvs");
  expect_refused(slurp(dir.path() / "mw8.kvs"), "max_write 8", "was saved as ring(window=");
  EXPECT_THROW(s.restore(dir.path() / "missing.kvs"), Error);
  EXPECT_GT(refused, 600);

  EXPECT_EQ(s.tokens(), twin.tokens());
  EXPECT_EQ(future(s, 10), future(twin, 10)) << "a refused restore changed the session";
  // The good file still restores.
  s.restore(good);
  s.sampling() = src.sampling();  // settings are not part of the file
  EXPECT_EQ(s.tokens(), src.tokens());
  EXPECT_EQ(future(s, 6), future(src, 6));
}
