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
#include "support/model_cache.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;

namespace {

std::shared_ptr<const Model> fixture(const std::string& family) { return shared_fixture(family); }

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

// Every KV format the family's head_dim takes (mistral, llama, qwen2: 16,
// so plain and fp8; gemma3: 32, so int8 / int4 groups of 32 too), K and V alike
// or mixed.
TEST_P(SessionFileFamilies, SaveRestoreContinuesBitwiseInEveryStorage) {
  const std::string family = GetParam();
  TempDir dir;
  const KvFormat i8{KvType::Int8, 32}, i4{KvType::Int4, 32}, fp8{KvType::Fp8};
  for (KvStorage storage : {KvStorage(DType::F32), KvStorage(DType::BF16), KvStorage(DType::F16), KvStorage(i8),
                            KvStorage(i4), KvStorage(fp8), KvStorage{i8, i4}, KvStorage{fp8, DType::BF16}}) {
    if (!kv_format_problem(storage.k, fixture(family)->config().head_dim).empty() ||
        !kv_format_problem(storage.v, fixture(family)->config().head_dim).empty())
      continue;
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
    EXPECT_EQ(future(b, 12), future(a, 12)) << kv_storage_name(storage);
    // A fork of the restored session continues like it too.
    auto f = b.fork();
    EXPECT_EQ(future(*f, 6), future(b, 6)) << kv_storage_name(storage);
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
  // Another format version (the version word follows the 8-byte magic); a
  // version 2 file labelled version 1 has per-layer formats the reader of
  // version 1 does not expect.
  std::string v3 = bytes;
  v3[8] = 3;
  expect_refused(v3, "version 3", "format version 3 is not supported");
  std::string v1 = bytes;
  v1[8] = 1;
  expect_refused(v1, "version 2 bytes as version 1");
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
  Session int4(fixture(family), {.capacity = 96, .max_write = 4, .kv_storage = KvFormat{KvType::Int4, 32}});
  int4.prefill(std::vector<int32_t>{1, 2, 3});
  int4.save(dir.path() / "int4.kvs");
  expect_refused(slurp(dir.path() / "int4.kvs"), "int4 storage", "holds a int4 g32 cache; this session stores f32");
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

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The same session in the version 1 layout (before per-layer K/V formats):
// the header section without the formats, version word 1. Only for plain
// storage, which is all version 1 had.
std::string as_version_1(const std::string& v2) {
  std::string out = v2.substr(0, 12);
  out[8] = 1;
  size_t at = 12;
  uint32_t tag = 0;
  uint64_t size = 0;
  std::memcpy(&tag, v2.data() + at, 4);
  std::memcpy(&size, v2.data() + at + 4, 8);
  const std::string head = v2.substr(at + 12, size);
  at += 12 + size + 8;
  // fingerprint u64, vocab i32, storage string, max_write i32, n_layers u32, then the layers.
  size_t p = 12;
  uint32_t len = 0;
  std::memcpy(&len, head.data() + p, 4);
  p += 4 + len + 4;
  uint32_t n_layers = 0;
  std::memcpy(&n_layers, head.data() + p, 4);
  p += 4;
  std::string h1 = head.substr(0, p);
  for (uint32_t l = 0; l < n_layers; ++l) {
    h1 += head.substr(p, 1 + 6 * 4);  // ring u8, six i32
    p += 1 + 6 * 4 + 2 * 5;           // then K and V formats: u8 + i32 each
  }
  EXPECT_EQ(p, head.size());
  const uint64_t n = h1.size(), sum = fnv1a(h1);
  out.append(reinterpret_cast<const char*>(&tag), 4);
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += h1;
  out.append(reinterpret_cast<const char*>(&sum), 8);
  return out + v2.substr(at);
}

}  // namespace

// Files written before the K/V formats were recorded (version 1) still restore.
TEST(SessionFile, Version1FilesStillRestore) {
  TempDir dir;
  const std::string family = "gemma3";
  for (DType storage : {DType::F32, DType::BF16}) {
    SessionOptions so{.capacity = 96, .max_write = 4, .kv_storage = storage};
    Session a(fixture(family), so), b(fixture(family), so);
    warm(a, family, 30);
    a.save(dir.path() / "v2.kvs");
    write(dir.path() / "v1.kvs", as_version_1(slurp(dir.path() / "v2.kvs")));
    b.sampling() = seeded(7);
    b.restore(dir.path() / "v1.kvs");
    EXPECT_EQ(b.tokens(), a.tokens());
    EXPECT_EQ(future(b, 8), future(a, 8)) << dtype_name(storage);
  }
}
