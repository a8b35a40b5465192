// The CLI contract (scripts rely on it) and its error paths: every failure is
// one line on stderr and a non-zero exit, never a crash.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/tokenizer.h"
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

// run_cli with stdin read from `in` and, when `out` is given, stdout written
// there (e.g. /dev/full) instead of captured.
RunResult run_cli_io(const std::string& args, const std::string& in, const std::string& out = "") {
  static int n = 0;
  const fs::path dir = fs::temp_directory_path();
  const fs::path o = dir / ("kvgraph_cli_io_out_" + std::to_string(getpid()) + "_" + std::to_string(n));
  const fs::path e = dir / ("kvgraph_cli_io_err_" + std::to_string(getpid()) + "_" + std::to_string(n++));
  const std::string cmd = std::string(KVGRAPH_CLI) + " " + args + " >" + (out.empty() ? o.string() : out) + " 2>" +
                          e.string() + " <" + in;
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (out.empty()) r.out = slurp(o);
  r.err = slurp(e);
  fs::remove(o);
  fs::remove(e);
  return r;
}

nlohmann::json parse_json_run(const RunResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

std::string llama_generate() { return "generate --model " + (fixtures_dir() / "llama").string() + " "; }
std::string default_dir() { return (fs::path(KVGRAPH_SOURCE_DIR) / "models" / "default").string(); }

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
  // With the defaults: a default repetition penalty (it was 1.1) made the
  // two differ from the 15th token of this run on.
  const std::string g = llama_generate() + "--prompt-ids 1,2,3 --max-tokens 40 --ignore-eos --json -q ";
  RunResult t0 = run_cli(g + "--temperature 0 --seed 7");
  RunResult greedy = run_cli(g + "--greedy --seed 8");
  ASSERT_EQ(t0.exit_code, 0) << t0.err;
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  EXPECT_EQ(nlohmann::json::parse(t0.out)["ids"], nlohmann::json::parse(greedy.out)["ids"]);
}

TEST(Cli, GenerateSeedIsRandomReportedAndReproduces) {
  const std::string g = llama_generate() + "--prompt-ids 1,2,3 --max-tokens 24 --ignore-eos --json -q ";
  auto a = parse_json_run(run_cli(g));
  auto b = parse_json_run(run_cli(g));
  ASSERT_TRUE(a.contains("seed") && b.contains("seed"));
  EXPECT_NE(a["seed"], b["seed"]) << "the default seed is drawn per run (equal with odds 2^-32)";
  // The reported seed, passed back, gives the same tokens bit for bit.
  auto again = parse_json_run(run_cli(g + "--seed " + std::to_string(a["seed"].get<uint64_t>())));
  EXPECT_EQ(again["ids"], a["ids"]);
  EXPECT_EQ(again["seed"], a["seed"]);
  auto s1 = parse_json_run(run_cli(g + "--seed 12345"));
  auto s2 = parse_json_run(run_cli(g + "--seed 12345"));
  EXPECT_EQ(s1["ids"], s2["ids"]);
  EXPECT_EQ(s1["seed"].get<uint64_t>(), 12345u);
  // Text mode reports it on the stats line.
  RunResult t = run_cli(llama_generate() + "--prompt-ids 1,2,3 --max-tokens 4 --seed 99");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_THAT(t.err, HasSubstr("seed 99"));
}

TEST(Cli, GenerateFinishReasonNamesEachEnd) {
  const std::string g = llama_generate() + "--prompt-ids 1,2,3 --json -q --seed 1 ";
  auto j = parse_json_run(run_cli(g + "--max-tokens 3 --ignore-eos"));
  EXPECT_EQ(j["finish_reason"], "max_tokens");
  EXPECT_FALSE(j.contains("stop_reason"));
  EXPECT_EQ(j["ids"].size(), 3u);
  auto l = parse_json_run(run_cli(g + "--max-tokens 20 --ignore-eos --capacity 8"));
  EXPECT_EQ(l["finish_reason"], "length");
}

TEST(Cli, GenerateFullCacheIsAStopThatKeepsEveryToken) {
  // Prompt 4 + 4 decoded tokens fill a cache of 8; the 5th token is sampled
  // and kept. Exit 0, not an error, in both modes.
  const std::string g = llama_generate() + "--prompt-ids 1,2,3,4 --capacity 8 --max-tokens 20 --ignore-eos -q --seed 5 ";
  RunResult jr = run_cli(g + "--json");
  ASSERT_EQ(jr.exit_code, 0) << jr.err;
  auto j = nlohmann::json::parse(jr.out);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["capacity"], 8);
  const auto ids = j["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids.size(), 5u);
  // Text mode: the same tokens, the line ended, then one notice (kept by -q).
  RunResult tr = run_cli(g);
  ASSERT_EQ(tr.exit_code, 0) << tr.err;
  EXPECT_EQ(tr.out, join_ids(ids, " ") + "\n");
  EXPECT_THAT(tr.err, HasSubstr("the cache is full (8 of 8 positions)"));
  EXPECT_EQ(std::count(tr.err.begin(), tr.err.end(), '\n'), 1) << tr.err;
}

TEST(Cli, GenerateHugeMaxTokensIsCappedAtTheTrainedPositions) {
  // The cache is sized min(prompt + max-tokens, max_position_embeddings = 512
  // for the fixture) in 64 bits: INT32_MAX neither wraps nor allocates for
  // itself. The run ends when the cache is full (or at EOS).
  for (const char* eos : {"--ignore-eos", ""}) {
    auto j = parse_json_run(run_cli(llama_generate() + "--prompt-ids 1,2,3 --max-tokens 2147483647 --json -q " + eos));
    EXPECT_EQ(j["capacity"], 512) << eos;
    const size_t n = j["ids"].size();
    if (j["finish_reason"] == "eos") {
      EXPECT_LT(n, 510u);
    } else {
      EXPECT_EQ(j["finish_reason"], "length") << eos;
      EXPECT_EQ(n, 512u - 3 + 1) << "every position used, and the last sampled token kept";
    }
  }
  // Small requests stay small: prompt 3 + 5 new tokens.
  auto small = parse_json_run(run_cli(llama_generate() + "--prompt-ids 1,2,3 --max-tokens 5 --json -q"));
  EXPECT_EQ(small["capacity"], 8);
}

TEST(Cli, CapacityBeyondTrainedPositionsWarnsOnce) {
  RunResult r = run_cli(llama_generate() + "--prompt-ids 1,2,3 --max-tokens 2 --capacity 1000 -q");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("warning: --capacity 1000 is beyond the 512 positions"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  RunResult ok = run_cli(llama_generate() + "--prompt-ids 1,2,3 --max-tokens 2 --capacity 512 -q");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.err, "");
}

TEST(Cli, GeneratePromptFromEachSourceIsTheSamePrompt) {
  const fs::path file = fs::temp_directory_path() / ("kvgraph_prompt_" + std::to_string(getpid()) + ".txt");
  std::ofstream(file) << "Once upon a time\n";  // one final newline, as echo writes it: dropped
  const std::string g = "generate --max-tokens 2 --json -q --seed 3 ";
  auto positional = parse_json_run(run_cli(g + "\"Once upon a time\""));
  const auto expect = positional["prompt_ids"];
  ASSERT_GT(expect.size(), 2u);
  EXPECT_EQ(parse_json_run(run_cli(g + "-p \"Once upon a time\""))["prompt_ids"], expect);
  EXPECT_EQ(parse_json_run(run_cli(g + "--prompt \"Once upon a time\""))["prompt_ids"], expect);
  EXPECT_EQ(parse_json_run(run_cli(g + "-f " + file.string()))["prompt_ids"], expect);
  EXPECT_EQ(parse_json_run(run_cli(g + "--file " + file.string()))["prompt_ids"], expect);
  EXPECT_EQ(parse_json_run(run_cli_io(g + "-", file.string()))["prompt_ids"], expect);
  EXPECT_EQ(parse_json_run(run_cli_io(g + "-f -", file.string()))["prompt_ids"], expect);
  EXPECT_EQ(parse_json_run(run_cli_io(g, file.string()))["prompt_ids"], expect);  // piped, no prompt flag
  fs::remove(file);
}

TEST(CliErrors, PromptSourcesAreCheckedAndNamed) {
  const std::string g = "generate --max-tokens 2 -q ";
  expect_usage_error(run_cli(g + "\"hi\" -p \"there\""), "give one prompt: TEXT and --prompt");
  expect_usage_error(run_cli(g + "-p hi --prompt-ids 1,2"), "--prompt and --prompt-ids");
  expect_usage_error(run_cli(g + "\"hi\" --prompt-ids 1,2"), "TEXT and --prompt-ids");
  expect_usage_error(run_cli(g + "-f /dev/null -p hi"), "--prompt and --file");
  RunResult missing = run_cli(g + "-f /nonexistent/prompt.txt");
  expect_one_line_error(missing, "cannot open /nonexistent/prompt.txt: No such file or directory");
  EXPECT_EQ(missing.exit_code, 1);
  const std::string dir = fs::temp_directory_path().string();
  expect_one_line_error(run_cli(g + "-f " + dir), "cannot open " + dir + ": it is a directory");
  // Nothing on stdin where the prompt was expected (run_cli's stdin is
  // /dev/null): an error, not generation from nothing.
  expect_one_line_error(run_cli(g), "the prompt from stdin is empty");
  expect_one_line_error(run_cli(g + "-"), "the prompt from stdin is empty");
  expect_one_line_error(run_cli(g + "-f /dev/null"), "the prompt from --file /dev/null is empty");
}

TEST(CliErrors, NoPromptAtATerminalIsAUsageError) {
  // stdin a terminal and no prompt: say so rather than wait for typing.
  // script(1) (bsdutils, essential on Debian) gives the command a pty.
  if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "no script(1) for a pty";
  const fs::path log = fs::temp_directory_path() / ("kvgraph_tty_" + std::to_string(getpid()) + ".txt");
  const std::string cmd =
      "script -qec '" + std::string(KVGRAPH_CLI) + " generate -q' /dev/null </dev/null >" + log.string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  const std::string out = slurp(log);
  fs::remove(log);
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 2) << out;
  EXPECT_THAT(out, HasSubstr("kvgraph: error: [cli] no prompt: give TEXT"));
}

TEST(Cli, VersionPrintsTheProjectVersion) {
  RunResult r = run_cli("--version");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_match(r.out, std::regex("kvgraph [0-9]+\\.[0-9]+\\.[0-9]+\n"))) << r.out;
  EXPECT_EQ(r.err, "");
}

TEST(CliErrors, WriteFailuresAreErrors) {
  // /dev/full: every write fails with ENOSPC.
  const std::string g = llama_generate() + "--prompt-ids 1,2,3 --max-tokens 4 -q ";
  RunResult dump = run_cli(g + "--dump-logits /dev/full");
  expect_one_line_error(dump, "[generate] cannot write --dump-logits /dev/full: No space left on device");
  EXPECT_EQ(dump.exit_code, 1);
  const std::string dir = fs::temp_directory_path().string();
  expect_one_line_error(run_cli(g + "--dump-logits " + dir), "cannot write --dump-logits " + dir);
  for (const char* mode : {"", "--json"}) {
    RunResult out = run_cli_io(g + mode, "/dev/null", "/dev/full");
    expect_one_line_error(out, "[generate] cannot write to stdout: No space left on device");
    EXPECT_EQ(out.exit_code, 1) << mode;
  }
  // Any command: the last flush of stdout is checked.
  RunResult inspect = run_cli_io("inspect", "/dev/null", "/dev/full");
  expect_one_line_error(inspect, "cannot write to stdout: No space left on device");
  EXPECT_EQ(inspect.exit_code, 1);
}

TEST(Cli, DumpLogitsWritesOneRowPerSampledToken) {
  const fs::path file = fs::temp_directory_path() / ("kvgraph_dump_" + std::to_string(getpid()) + ".bin");
  auto j = parse_json_run(run_cli(llama_generate() + "--prompt-ids 1,2,3 --max-tokens 4 --ignore-eos --json -q "
                                                     "--dump-logits " + file.string()));
  const int vocab = load_reference("llama").vocab;
  EXPECT_EQ(fs::file_size(file), j["ids"].size() * vocab * sizeof(float));
  fs::remove(file);
}

TEST(Cli, StopStringIsLeftOutOfTextAndJsonAlike) {
  // The stop string and what follows are in neither output; the ids end with
  // the token that completed it.
  const std::string g = "generate \"The meaning of life is\" --max-tokens 60 --greedy --stop \"--\" -q ";
  RunResult text = run_cli(g);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  auto j = parse_json_run(run_cli(g + "--json"));
  ASSERT_EQ(j["finish_reason"], "stop");
  const std::string t = j["text"].get<std::string>();
  EXPECT_EQ(text.out, t + "\n");
  EXPECT_EQ(t.find("--"), std::string::npos);
  const auto tok = kvgraph::Tokenizer::from_file(default_dir());
  const auto ids = j["ids"].get<std::vector<int32_t>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_NE(tok.decode(ids, true).find("--"), std::string::npos);
  EXPECT_EQ(tok.decode(std::vector<int32_t>(ids.begin(), ids.end() - 1), true).find("--"), std::string::npos);
  EXPECT_EQ(tok.decode(ids, true).substr(0, t.size()), t);
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
  expect_usage_error(run_cli(g + "--v-dtype int3"), "--v-dtype int3: expected f32, bf16, f16, int8, int4 or fp8");
  expect_usage_error(run_cli(g + "--kv-dtype int8 --kv-group 128"), "--kv-group 128: expected 32 or 64");
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

TEST(CliErrors, BadTokenIdsAndFlags) {
  const std::string m = " --model " + (fixtures_dir() / "llama").string();
  expect_one_line_error(run_cli("generate" + m + " --prompt-ids 1,x,3"), "\"x\" is not a token id");
  expect_one_line_error(run_cli("generate" + m + " --prompt-ids 1,999"), "token id 999 out of range");
  expect_one_line_error(run_cli("generate" + m + " --prompt-ids 1 --kv-dtype f8"), "--kv-dtype f8");
  // A KV format the model's head_dim (16) cannot take: refused before the weights load.
  expect_one_line_error(run_cli("generate" + m + " --prompt-ids 1 --kv-dtype int4"),
                        "--kv-dtype int4 g64 does not fit this model: group 64 does not divide head_dim 16");
  expect_one_line_error(run_cli("inspect" + m + " --k-dtype int8 --kv-group 32"),
                        "--k-dtype int8 g32 does not fit this model: group 32 does not divide head_dim 16");
  expect_one_line_error(run_cli("generate --model synthetic:nope --prompt-ids 1"), "unknown synthetic model");
  expect_one_line_error(run_cli("score" + m + " --ids /nonexistent/ids.txt"), "cannot open");
}

TEST(CliErrors, CudaDeviceWithoutCudaIsAClearError) {
  RunResult r = run_cli("generate --model " + (fixtures_dir() / "llama").string() + " --prompt-ids 1 --device cuda");
  if (r.exit_code == 0) GTEST_SKIP() << "a CUDA device is present";
  expect_one_line_error(r, "--device cuda");
}

// The prefill step is 64 tokens on the cpu (bench's JSON above) and 512 on
// cuda unless --chunk says otherwise; an explicit --chunk wins on both.
TEST(Cli, PrefillChunkDefaultsByDevice) {
  RunResult given = run_cli("bench --prompt 8 --new-tokens 2 --json -q --chunk 4");
  ASSERT_EQ(given.exit_code, 0) << given.err;
  EXPECT_EQ(nlohmann::json::parse(given.out)["chunk"], 4);
  RunResult cuda = run_cli("bench --prompt 8 --new-tokens 2 --json -q --device cuda");
  if (cuda.exit_code != 0 && cuda.err.find("--device cuda") != std::string::npos)
    GTEST_SKIP() << "no CUDA here: " << cuda.err;
  ASSERT_EQ(cuda.exit_code, 0) << cuda.err;
  EXPECT_EQ(nlohmann::json::parse(cuda.out)["chunk"], 512);
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

// The quantized KV bytes are what bench counts in its floor, and each row
// names its kv_dtype; --no-prefill decodes after positions taken as filled.
TEST(Cli, BenchCountsQuantizedKvBytesAndNamesTheFormat) {
  RunResult bf = run_cli("bench --prompt 32 --new-tokens 4 --json -q --kv-dtype bf16");
  RunResult q4 = run_cli("bench --prompt 32 --new-tokens 4 --json -q --kv-dtype int4 --no-prefill");
  ASSERT_EQ(bf.exit_code, 0) << bf.err;
  ASSERT_EQ(q4.exit_code, 0) << q4.err;
  auto a = nlohmann::json::parse(bf.out), b = nlohmann::json::parse(q4.out);
  EXPECT_EQ(a["kv_dtype"], "bf16");
  EXPECT_EQ(b["kv_dtype"], "int4 g64");
  // The default model: head_dim 64, one group of 64: a K or V row is 32 + 4 bytes against 128.
  EXPECT_NEAR(b["kv_bytes_per_token_avg"].get<double>() / a["kv_bytes_per_token_avg"].get<double>(), 36.0 / 128, 1e-12);
  EXPECT_TRUE(b["prefill_tok_s"].is_null());
  EXPECT_TRUE(b["ttft_ms"].is_null());
  EXPECT_TRUE(b["context_filled_without_prefill"].get<bool>());
  EXPECT_FALSE(a["prefill_tok_s"].is_null());
  // Time to first token is the prefill's time: prompt / (tokens per second).
  EXPECT_NEAR(a["ttft_ms"].get<double>(), 32 / a["prefill_tok_s"].get<double>() * 1e3,
              1e-9 * a["ttft_ms"].get<double>());
  EXPECT_EQ(a["chunk"], 64);
}

// On the CPU the embedded model sits in the last-level cache: a DRAM floor
// would print more than 100% "of floor", so bench says n/a (null in JSON)
// exactly when the bytes a step reads fit in that cache.
TEST(Cli, BenchFloorIsNotApplicableWhenTheModelFitsInCache) {
  RunResult r = run_cli("bench --prompt 8 --new-tokens 4 --json -q");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const double bytes = j["weight_bytes_read_per_token"].get<double>() + j["kv_bytes_per_token_avg"].get<double>();
  long llc = 0;
  for (int name : {_SC_LEVEL4_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE})
    if (llc <= 0) llc = sysconf(name);
  const bool fits = llc > 0 && bytes <= double(llc);
  EXPECT_EQ(j["floor_applies"].get<bool>(), !fits);
  EXPECT_EQ(j["fraction_of_floor"].is_null(), fits);
  RunResult text = run_cli("bench --prompt 8 --new-tokens 4 -q");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  if (fits)
    EXPECT_THAT(text.out, HasSubstr("n/a"));
  else
    EXPECT_THAT(text.out, ::testing::Not(HasSubstr("n/a")));
}
