// `kvgraph generate --lookup-ngram N | --draft-model DIR --draft-tokens K`:
// greedy output identical to plain `generate`, the statistics on stderr and
// in --json, every bad combination one clear error; `kvgraph bench
// --verify-tokens T` times a verify step beside a decode step.
#include <nlohmann/json.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/fixtures.h"
#include "support/run.h"

using namespace kvgraph::testing;
using ::testing::HasSubstr;

namespace {

std::string default_model() { return (std::filesystem::path(KVGRAPH_SOURCE_DIR) / "models" / "default").string(); }

// A passage, then the start of it again.
const char* kPrompt =
    "\"You have a deep appreciation of the arts and music. Good news from afar can bring you a welcome visitor."
    "\n%\nYou have a deep\"";

nlohmann::json json_of(const RunResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

}  // namespace

TEST(SpeculativeCli, GreedyLookupAndDraftPrintThePlainOutput) {
  const std::string base = std::string("generate -p ") + kPrompt + " --greedy --max-tokens 48 --json";
  const nlohmann::json plain = json_of(run_cli(base));
  for (const std::string& flags : std::vector<std::string>{" --lookup-ngram 3 --draft-tokens 4",
                                                           " --lookup-ngram 1 --draft-tokens 7",
                                                           " --draft-model " + default_model() + " --draft-tokens 3"}) {
    const nlohmann::json spec = json_of(run_cli(base + flags));
    EXPECT_EQ(spec["ids"], plain["ids"]) << flags;
    EXPECT_EQ(spec["text"], plain["text"]) << flags;
    EXPECT_EQ(spec["finish_reason"], plain["finish_reason"]) << flags;
    const auto& st = spec["speculative"];
    EXPECT_GT(st["verify_steps"].get<int>(), 0) << flags;
    EXPECT_GE(st["proposed"].get<int>(), st["accepted"].get<int>()) << flags;
    EXPECT_NEAR(st["acceptance_rate"].get<double>(),
                double(st["accepted"].get<int>()) / std::max(1, st["proposed"].get<int>()), 1e-12);
    if (flags.find("draft-model") != std::string::npos) {
      EXPECT_EQ(st["method"], "draft");
      EXPECT_EQ(st["accepted"], st["proposed"]) << "the model as its own draft agrees with itself";
    } else {
      EXPECT_EQ(st["method"], "lookup");
    }
  }
  // Text mode: the same text, and the statistics line on stderr.
  const RunResult t = run_cli(std::string("generate -p ") + kPrompt + " --greedy --max-tokens 48 --lookup-ngram 2");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_EQ(t.out, plain["text"].get<std::string>() + "\n");
  EXPECT_THAT(t.err, HasSubstr("[kvgraph] speculative, prompt lookup (n-gram 2), K 4:"));
  EXPECT_THAT(t.err, HasSubstr("accepted ("));
}

TEST(SpeculativeCli, SampledRunsAreReproducibleWithTheSeed) {
  const std::string cmd = std::string("generate -p ") + kPrompt +
                          " --max-tokens 40 --seed 11 --temperature 0.9 --top-k 30 --lookup-ngram 2 --json";
  nlohmann::json a = json_of(run_cli(cmd)), b = json_of(run_cli(cmd));
  EXPECT_EQ(a["ids"], b["ids"]);
  a["speculative"].erase("tokens_per_second");
  b["speculative"].erase("tokens_per_second");
  EXPECT_EQ(a["speculative"], b["speculative"]);
}

TEST(SpeculativeCli, BadCombinationsAreOneClearError) {
  const std::string base = "generate -p hello --max-tokens 8 ";
  struct Case {
    std::string flags, message;
    int code;
  };
  const std::vector<Case> cases = {
      {"--lookup-ngram 2 --draft-model " + default_model(), "give one of --draft-model and --lookup-ngram", 2},
      {"--draft-tokens 3", "--draft-tokens needs --draft-model DIR or --lookup-ngram N", 2},
      {"--lookup-ngram 0", "--lookup-ngram 0: expected an integer >= 1", 2},
      {"--lookup-ngram 2 --draft-tokens 8", "--draft-tokens 8: expected an integer in [1, 7]", 2},
      {"--lookup-ngram 2 --draft-tokens 0", "--draft-tokens 0: expected an integer in [1, 7]", 2},
      {"--lookup-ngram 2 --draft-tokens 4 --chunk 4", "--draft-tokens 4: expected an integer in [1, 3]", 2},
      {"--lookup-ngram 2 --dump-logits /dev/null", "--dump-logits cannot be combined", 2},
      {"--draft-model " + (fixtures_dir() / "llama").string(),
       "its vocabulary has 256 ids, the model's 4096; a draft must share", 1},
      {"--draft-model /nonexistent/dir", "/nonexistent/dir", 1},
  };
  for (const Case& c : cases) {
    const RunResult r = run_cli(base + c.flags);
    EXPECT_EQ(r.exit_code, c.code) << c.flags << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.flags;
    EXPECT_THAT(r.err, HasSubstr("kvgraph: error:")) << c.flags;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.flags << "\n" << r.err;
  }
}

TEST(SpeculativeCli, BenchTimesAVerifyStep) {
  const RunResult r = run_cli("bench --prompt 16 --new-tokens 12 --verify-tokens 5 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verify_tokens"], 5);
  EXPECT_GT(j["verify_ms_median"].get<double>(), 0.0);
  EXPECT_NEAR(j["verify_over_decode"].get<double>(),
              j["verify_ms_median"].get<double>() / j["decode_ms_median"].get<double>(), 1e-9);
  EXPECT_GE(j["verify_with_rollback_ms_median"].get<double>(), j["verify_ms_median"].get<double>());
  const RunResult text = run_cli("bench --prompt 16 --new-tokens 12 --verify-tokens 3");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("verify step of 3 tokens:"));
  for (const std::string bad : {"--verify-tokens 1", "--verify-tokens 9", "--verify-tokens 5 --chunk 4"}) {
    const RunResult b = run_cli("bench --prompt 16 --new-tokens 12 " + bad);
    EXPECT_EQ(b.exit_code, 2) << bad;
    EXPECT_THAT(b.err, HasSubstr("--verify-tokens")) << bad;
  }
}
