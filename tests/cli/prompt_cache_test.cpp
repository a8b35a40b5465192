// `kvgraph cache-prompt` + `generate --prompt-cache`: output (tokens and the
// dumped logits) byte-identical to a run without the cache, greedy and
// seeded, on every fixture family; the reuse is reported.
#include <filesystem>
#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/fixtures.h"
#include "support/run.h"
#include "support/temp_dir.h"

using namespace kvgraph::testing;
using ::testing::HasSubstr;

namespace {

std::string ids_arg(const std::vector<int32_t>& ids, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

class PromptCacheCli : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(PromptCacheCli, GenerateWithTheCacheIsByteIdenticalAndReportsTheReuse) {
  const std::string family = GetParam();
  const Reference ref = load_reference(family);
  TempDir dir;
  const std::string model = "-m " + (fixtures_dir() / family).string() + " --chunk 4 -q";
  // Cached: the first 21 ids (sliding layers are rings, as in the asked run)
  // or the first 5 (the capacity is 5: sliding layers are flat in the file
  // and restore into rings). Asked: the first 37; whole chunks of 4 are kept.
  for (const auto& [cached_n, reused] : {std::pair{21, 20}, std::pair{5, 4}}) {
    const auto cache = dir.path() / ("p" + std::to_string(cached_n) + ".kvs");
    RunResult c = run_cli("cache-prompt " + model + " --prompt-ids " + ids_arg(ref.ids, cached_n) + " -o " +
                          cache.string());
    ASSERT_EQ(c.exit_code, 0) << c.err;
    ASSERT_TRUE(std::filesystem::exists(cache));
    for (const std::string sampling : {"--greedy", "--seed 5 --temperature 0.9 --repeat-penalty 1.2"}) {
      const std::string args = "generate -m " + (fixtures_dir() / family).string() + " --chunk 4 --prompt-ids " +
                               ids_arg(ref.ids, 37) + " --max-tokens 12 --ignore-eos " + sampling;
      RunResult plain = run_cli(args + " --dump-logits " + (dir.path() / "plain.bin").string());
      RunResult cached = run_cli(args + " --prompt-cache " + cache.string() + " --dump-logits " +
                                 (dir.path() / "cached.bin").string());
      ASSERT_EQ(plain.exit_code, 0) << plain.err;
      ASSERT_EQ(cached.exit_code, 0) << cached.err;
      EXPECT_EQ(cached.out, plain.out) << sampling;
      EXPECT_FALSE(plain.out.empty());
      const std::string a = slurp(dir.path() / "plain.bin"), b = slurp(dir.path() / "cached.bin");
      EXPECT_EQ(a.size(), 12u * ref.vocab * 4);
      EXPECT_TRUE(a == b) << family << ": dumped logits differ (" << sampling << ", cached " << cached_n << ")";
      EXPECT_THAT(cached.err, HasSubstr("prompt cache " + cache.string() + ": reused " + std::to_string(reused) +
                                        " of 37 prompt tokens, prefilled " + std::to_string(37 - reused)))
          << cached.err;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, PromptCacheCli, ::testing::ValuesIn(fixture_families()),
                         [](const auto& info) { return info.param; });

TEST(PromptCacheCliErrors, AFileOfAnotherModelIsAnErrorAndAMissingOneIsCreated) {
  const Reference ref = load_reference("llama");
  TempDir dir;
  const auto cache = dir.path() / "q.kvs";
  RunResult c = run_cli("cache-prompt -q -m " + (fixtures_dir() / "qwen3").string() + " --prompt-ids 1,2,3 -o " +
                        cache.string());
  ASSERT_EQ(c.exit_code, 0) << c.err;
  RunResult g = run_cli("generate -q -m " + (fixtures_dir() / "llama").string() + " --prompt-ids 1,2,3 --greedy " +
                        "--max-tokens 2 --prompt-cache " + cache.string());
  EXPECT_EQ(g.exit_code, 1);
  EXPECT_THAT(g.err, HasSubstr("kvgraph: error: [session_file] " + cache.string() + " was saved with another model"));
  EXPECT_TRUE(g.out.empty());
  // Missing: created from this prompt, then reused by the next run.
  const auto fresh = dir.path() / "new.kvs";
  const std::string args = "generate -m " + (fixtures_dir() / "llama").string() + " --chunk 4 --prompt-ids " +
                           ids_arg(ref.ids, 10) + " --greedy --max-tokens 3 --prompt-cache " + fresh.string();
  RunResult first = run_cli(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_THAT(first.err, HasSubstr("created"));
  RunResult second = run_cli(args);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.out, first.out);
  EXPECT_THAT(second.err, HasSubstr("reused 8 of 10 prompt tokens, prefilled 2"));
  RunResult usage = run_cli("cache-prompt -m " + (fixtures_dir() / "llama").string() + " --prompt-ids 1,2");
  EXPECT_EQ(usage.exit_code, 2);
}
