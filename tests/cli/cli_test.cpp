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
  expect_one_line_error(run_cli("generate --model /nonexistent/model \"hi\""), "does not exist");
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
