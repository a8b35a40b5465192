// The embedded default model (models/default, trained by
// tools/train_default.py): it loads, matches transformers' greedy decoding,
// its held-out perplexity is what its card says, and the CLI generates
// readable text with it.
#include <cmath>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "kvgraph/tokenizer.h"
#include "support/run.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;

namespace {
std::filesystem::path default_dir() { return std::filesystem::path(KVGRAPH_SOURCE_DIR) / "models" / "default"; }
nlohmann::json eval_json() {
  std::ifstream in(default_dir() / "heldout_eval.json");
  return nlohmann::json::parse(in);
}
}  // namespace

TEST(DefaultModel, UsesRingAndFlatLayersTogether) {
  auto m = Model::load(default_dir(), Device::CPU);
  CacheConfig c = m->cache_config(512, 64, DType::F32);
  int ring = 0, flat = 0;
  for (const auto& l : c.layers) (l.policy.is_ring() ? ring : flat)++;
  EXPECT_GT(ring, 0);
  EXPECT_GT(flat, 0);
}

TEST(DefaultModel, TokenizerMatchesTrainingTokenizer) {
  auto tok = Tokenizer::from_file(default_dir() / "tokenizer.json");
  const nlohmann::json j = eval_json();  // keep it alive across the loop
  for (const auto& c : j["tokenizer_cases"])
    EXPECT_EQ(tok.encode(c["text"].get<std::string>(), true), c["ids_with_bos"].get<std::vector<int32_t>>())
        << c["text"];
}

TEST(DefaultModel, GreedyDecodingMatchesTransformers) {
  auto m = Model::load(default_dir(), Device::CPU);
  int agree = 0, total = 0;
  const nlohmann::json j = eval_json();  // keep it alive across the loop
  for (const auto& c : j["greedy_reference"]["cases"]) {
    auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    auto expect = c["greedy_new_ids"].get<std::vector<int32_t>>();
    SessionOptions so;
    so.capacity = 256;
    Session s(m, so);
    s.prefill(prompt);
    std::vector<int32_t> out{s.sample()};
    while (out.size() < expect.size()) out.push_back(s.decode());
    ++total;
    agree += out == expect;
    // Near-ties may flip between implementations; the first tokens may not.
    EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 8), std::vector<int32_t>(expect.begin(), expect.begin() + 8))
        << c["prompt"];
  }
  EXPECT_GE(agree, total - 1) << "more than one greedy continuation differs from transformers";
}

TEST(DefaultModel, HeldOutPerplexityIsWhatTheCardSays) {
  auto j = eval_json();
  RunResult r = run_cli("perplexity " + (std::filesystem::path(KVGRAPH_SOURCE_DIR) / "data/corpus/heldout.txt").string() +
                        " --separator % --ctx " + std::to_string(j["chunk_len"].get<int>()) + " --json --chunk 256");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto p = nlohmann::json::parse(r.out);
  EXPECT_EQ(p["chunks"].get<int>(), j["num_chunks"].get<int>());
  EXPECT_EQ(p["tokens_scored"].get<int>(), j["predicted_tokens"].get<int>());
  EXPECT_NEAR(p["perplexity"].get<double>(), j["perplexity"].get<double>(), 1e-3 * j["perplexity"].get<double>());
}

TEST(DefaultModel, GenerateWithNoModelFlagPrintsReadableText) {
  RunResult r = run_cli("generate \"The meaning of life is\" --max-tokens 24 --greedy");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(r.out.size(), 20u);
  // Mostly letters and spaces: readable English, not byte soup.
  size_t letters = 0;
  for (char c : r.out) letters += std::isalpha(static_cast<unsigned char>(c)) || c == ' ';
  EXPECT_GT(letters, r.out.size() * 7 / 10) << r.out;
  EXPECT_THAT(r.err, HasSubstr("ms/tok"));
}

TEST(DefaultModel, StopStringEndsGenerationBeforeIt) {
  RunResult r = run_cli("generate \"The meaning of life is\" --max-tokens 60 --greedy --stop \"--\" --json -q");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_EQ(j["text"].get<std::string>().find("--"), std::string::npos);
}
