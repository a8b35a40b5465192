// The CLI contract (scripts rely on it) and its error paths: every failure is
// one line on stderr and a non-zero exit, never a crash.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/fixtures.h"
#include "support/run.h"

using namespace kvgraph::testing;
using ::testing::HasSubstr;
using ::testing::StartsWith;
namespace fs = std::filesystem;

namespace {

std::string join_ids(const std::vector<int32_t>& ids, const char* sep) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
  return s;
}

// A scratch copy of a fixture model that a test may damage.
fs::path copy_fixture(const std::string& family, const std::string& tag) {
  fs::path dst = fs::temp_directory_path() / ("kvgraph_cli_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(dst);
  fs::copy(fixtures_dir() / family, dst, fs::copy_options::recursive);
  return dst;
}

void expect_one_line_error(const RunResult& r, const std::string& what) {
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, StartsWith("kvgraph: error: "));
  EXPECT_THAT(r.err, HasSubstr(what));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// A bad command line: exit 2 and exactly one line on stderr that names the
// flag (`what`), under [cli].
void expect_usage_error(const RunResult& r, const std::string& what) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_one_line_error(r, what);
  EXPECT_THAT(r.err, StartsWith("kvgraph: error: [cli] "));
}

}  // namespace

TEST(Cli, GenerateJsonGreedyIgnoreEosMatchesTransformers) {
  for (const auto& fam : fixture_families()) {
    Reference ref = load_reference(fam);
    RunResult r = run_cli("generate --model " + (fixtures_dir() / fam).string() + " --prompt-ids \"" +
                          join_ids(ref.greedy_prompt, ",") + "\" --max-tokens " + std::to_string(ref.greedy.size()) +
                          " --greedy --ignore-eos --json -q");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), ref.greedy) << fam;
    EXPECT_EQ(j["captures"].get<int>(), 1);
  }
}

TEST(Cli, ScoreMatchesTransformersNllAndArgmax) {
  Reference ref = load_reference("gemma2");
  fs::path ids = fs::temp_directory_path() / "kvgraph_score_ids.txt";
  std::ofstream(ids) << join_ids(ref.ids, " ") << "\n";
  for (int chunk : {1, 7, 128}) {
    RunResult r = run_cli("score --model " + (fixtures_dir() / "gemma2").string() + " --ids " + ids.string() +
                          " --chunk " + std::to_string(chunk));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    auto nll = j["nll"].get<std::vector<double>>();
    auto am = j["argmax"].get<std::vector<int32_t>>();
    ASSERT_EQ(nll.size(), ref.ids.size() - 1);
    ASSERT_EQ(am.size(), ref.ids.size());
    double total = 0;
    for (size_t i = 0; i + 1 < ref.ids.size(); ++i) {
      const float* row = ref.logits.data() + i * ref.vocab;
      double mx = *std::max_element(row, row + ref.vocab), sum = 0;
      for (int v = 0; v < ref.vocab; ++v) sum += std::exp(row[v] - mx);
      const double expect = -(row[ref.ids[i + 1]] - mx - std::log(sum));
      EXPECT_NEAR(nll[i], expect, 1e-3) << "position " << i + 1;
      EXPECT_EQ(am[i], std::max_element(row, row + ref.vocab) - row) << "position " << i;
      total += expect;
    }
    EXPECT_NEAR(j["total_nll"].get<double>(), total, 1e-2);
  }
}

TEST(CliErrors, MissingModelDirectory) {
  RunResult r = run_cli("generate --model /nonexistent/model \"hi\"");
  expect_one_line_error(r, "does not exist");
  EXPECT_EQ(r.exit_code, 1);  // a runtime error, not a usage error
}

TEST(CliErrors, SamplingFlagsOutOfRangeAreUsageErrors) {
  const std::string g = "generate --model " + (fixtures_dir() / "llama").string() + " --prompt-ids 1,2 ";
  expect_usage_error(run_cli(g + "--temperature nan"), "--temperature nan");
  expect_usage_error(run_cli(g + "--temperature -1"), "--temperature -1");
  expect_usage_error(run_cli(g + "--temperature inf"), "--temperature inf");
  expect_usage_error(run_cli(g + "--repeat-penalty 0"), "--repeat-penalty 0");
  expect_usage_error(run_cli(g + "--repeat-penalty nan"), "--repeat-penalty nan");
  expect_usage_error(run_cli(g + "--repeat-penalty -1"), "--repeat-penalty -1");
  expect_usage_error(run_cli(g + "--top-p 1.5"), "--top-p 1.5: expected a number in (0, 1]");
  expect_usage_error(run_cli(g + "--top-p nan"), "--top-p nan");
  expect_usage_error(run_cli(g + "--top-p 0"), "--top-p 0");
  expect_usage_error(run_cli(g + "--top-k -3"), "--top-k -3");
  expect_usage_error(run_cli(g + "--greedy --top-p 2"), "--top-p 2");  // checked as given, --greedy or not
  expect_usage_error(run_cli("chat --top-p 1.5"), "--top-p 1.5");
  expect_usage_error(run_cli("chat --repeat-penalty 0"), "--repeat-penalty 0");
}

TEST(Cli, TemperatureZeroIsExactlyGreedy) {
  const std::string g = "generate --model " + (fixtures_dir() / "llama").string() +
                        " --prompt-ids 1,2,3 --max-tokens 8 --ignore-eos --json -q --repeat-penalty 1 ";
  RunResult t0 = run_cli(g + "--temperature 0 --seed 7");
  RunResult greedy = run_cli(g + "--greedy --seed 8");
  ASSERT_EQ(t0.exit_code, 0) << t0.err;
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  EXPECT_EQ(nlohmann::json::parse(t0.out)["ids"], nlohmann::json::parse(greedy.out)["ids"]);
}

TEST(CliErrors, ParseErrorsAreOneLineAndExitTwo) {
  const std::string g = "generate --model " + (fixtures_dir() / "llama").string() + " --prompt-ids 1,2 ";
  expect_usage_error(run_cli(g + "--no-such-flag"), "--no-such-flag");
  expect_usage_error(run_cli(g + "--chunk abc"), "--chunk");
  expect_usage_error(run_cli(g + "--max-tokens"), "--max-tokens");
  expect_usage_error(run_cli(g + "--cpu-weights f8"), "--cpu-weights");
  expect_usage_error(run_cli("score --chunk 4"), "--ids");
  expect_usage_error(run_cli("no-such-command"), "no-such-command");
  expect_usage_error(run_cli(""), "subcommand");
  RunResult help = run_cli("generate --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("--top-p"));
  EXPECT_EQ(help.err, "");
}

TEST(CliErrors, NumericFlagsOutOfRangeNameTheFlag) {
  const std::string m = " --model " + (fixtures_dir() / "llama").string();
  const std::string g = "generate" + m + " --prompt-ids 1,2 ";
  expect_usage_error(run_cli(g + "--chunk 0"), "--chunk 0");
  expect_usage_error(run_cli(g + "--chunk -4"), "--chunk -4");
  expect_usage_error(run_cli(g + "--max-tokens -1"), "--max-tokens -1");
  expect_usage_error(run_cli(g + "--max-tokens 0"), "--max-tokens 0");
  expect_usage_error(run_cli(g + "--capacity -3"), "--capacity -3");
  expect_usage_error(run_cli(g + "--kv-dtype f8"), "--kv-dtype f8");
  expect_usage_error(run_cli("bench" + m + " --prompt -1"), "--prompt -1");
  expect_usage_error(run_cli("bench" + m + " --new-tokens 0"), "--new-tokens 0");
  expect_usage_error(run_cli("bench" + m + " --prompt 2000000000 --new-tokens 2000000000"), "--prompt 2000000000");
  expect_usage_error(run_cli("chat" + m + " --max-tokens -2"), "--max-tokens -2");
  expect_usage_error(run_cli("chat" + m + " --chunk 0"), "--chunk 0");
  expect_usage_error(run_cli("score" + m + " --ids /nonexistent/ids.txt --chunk 0"), "--chunk 0");
  expect_usage_error(run_cli("perplexity" + m + " /nonexistent.txt --ctx 1"), "--ctx 1");
  expect_usage_error(run_cli("inspect" + m + " --chunk 0"), "--chunk 0");
  expect_usage_error(run_cli("inspect" + m + " --capacity -1"), "--capacity -1");
}

TEST(CliErrors, MalformedConfigJson) {
  fs::path d = copy_fixture("llama", "badjson");
  std::ofstream(d / "config.json") << "{\"model_type\": \"llama\", ";
  expect_one_line_error(run_cli("generate --model " + d.string() + " --prompt-ids 1,2"), "[config]");
}

TEST(CliErrors, UnknownArchitecture) {
  fs::path d = copy_fixture("llama", "arch");
  std::ofstream(d / "config.json") << R"({"model_type": "bert", "hidden_size": 8})";
  expect_one_line_error(run_cli("generate --model " + d.string() + " --prompt-ids 1,2"), "unknown model_type \"bert\"");
}

TEST(CliErrors, TruncatedSafetensors) {
  fs::path d = copy_fixture("qwen3", "trunc");
  fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") / 2);
  expect_one_line_error(run_cli("generate --model " + d.string() + " --prompt-ids 1,2"), "[safetensors]");
}

TEST(CliErrors, MissingTensorIsNamed) {
  fs::path d = copy_fixture("mistral", "missing");
  fs::remove(d / "model.safetensors");
  expect_one_line_error(run_cli("generate --model " + d.string() + " --prompt-ids 1,2"), "model.safetensors");
}

TEST(CliErrors, MalformedTokenizer) {
  fs::path d = copy_fixture("gemma3", "tok");
  std::ofstream(d / "tokenizer.json") << "{ not json";
  expect_one_line_error(run_cli("generate --model " + d.string() + " \"hello\""), "[tokenizer]");
}

TEST(CliErrors, NoTokenizerForTextPrompt) {
  expect_one_line_error(run_cli("generate --model " + (fixtures_dir() / "llama").string() + " \"hello\""),
                        "no tokenizer.json");
}

TEST(CliErrors, PromptLongerThanCache) {
  expect_one_line_error(run_cli("generate --model " + (fixtures_dir() / "llama").string() +
                                " --prompt-ids 1,2,3,4,5,6,7,8,9,10 --capacity 8"),
                        "longer than the cache capacity 8");
}

TEST(CliErrors, CacheFillsDuringGeneration) {
  expect_one_line_error(run_cli("generate --model " + (fixtures_dir() / "llama").string() +
                                " --prompt-ids 1,2,3,4 --capacity 8 --max-tokens 20 --ignore-eos"),
                        "cache is full");
}

TEST(CliErrors, BadTokenIdsAndFlags) {
  const std::string m = " --model " + (fixtures_dir() / "llama").string();
  expect_one_line_error(run_cli("generate" + m + " --prompt-ids 1,x,3"), "\"x\" is not a token id");
  expect_one_line_error(run_cli("generate" + m + " --prompt-ids 1,999"), "token id 999 out of range");
  expect_one_line_error(run_cli("generate" + m + " --prompt-ids 1 --kv-dtype f8"), "--kv-dtype f8");
  expect_one_line_error(run_cli("generate --model synthetic:nope --prompt-ids 1"), "unknown synthetic model");
  expect_one_line_error(run_cli("score" + m + " --ids /nonexistent/ids.txt"), "cannot open");
}

TEST(CliErrors, CudaDeviceWithoutCudaIsAClearError) {
  RunResult r = run_cli("generate --model " + (fixtures_dir() / "llama").string() + " --prompt-ids 1 --device cuda");
  if (r.exit_code == 0) GTEST_SKIP() << "a CUDA device is present";
  expect_one_line_error(r, "--device cuda");
}

TEST(Cli, HelpListsEveryCommandWithExamples) {
  RunResult r = run_cli("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* c : {"generate", "chat", "score", "perplexity", "bench", "inspect"}) EXPECT_THAT(r.out, HasSubstr(c));
  RunResult g = run_cli("generate --help");
  EXPECT_THAT(g.out, HasSubstr("Examples:"));
}

TEST(Cli, ChatKeepsTheCacheBetweenTurns) {
  // Two turns through stdin with the embedded model: the second turn
  // prefills only its own tokens (plus the pending stop token), not the
  // conversation so far.
  fs::path in = fs::temp_directory_path() / "kvgraph_chat_in.txt";
  std::ofstream(in) << "The meaning of life is\nA computer is\n\n";
  auto out = fs::temp_directory_path() / "kvgraph_chat_out.txt";
  auto err = fs::temp_directory_path() / "kvgraph_chat_err.txt";
  std::string cmd = std::string(KVGRAPH_CLI) + " chat --max-tokens 12 --temperature 0 <" + in.string() + " >" +
                    out.string() + " 2>" + err.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(err);
  std::string e = slurp(err);
  std::vector<std::pair<int, int>> turns;  // (prefilled, cache)
  size_t at = 0;
  while ((at = e.find("prefilled ", at)) != std::string::npos) {
    int pre = std::stoi(e.substr(at + 10));
    size_t c = e.find("cache ", at);
    turns.push_back({pre, std::stoi(e.substr(c + 6))});
    at = c;
  }
  ASSERT_EQ(turns.size(), 2u) << e;
  EXPECT_LT(turns[1].first, turns[1].second - turns[0].second + 2);  // only the new turn's tokens
  EXPECT_GT(turns[1].second, turns[0].second);
  EXPECT_GT(slurp(out).size(), 10u);
}
