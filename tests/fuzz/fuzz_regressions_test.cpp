// Every input a fuzz target (tests/fuzz/*_fuzz.cpp) ever crashed on, kept in
// tests/fuzz/regressions/<target>/ and loaded here through the normal API:
// each must end in a kvgraph::Error (or load), never a crash or another
// exception. Plus one minimal, named test per bug the fuzzers found.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "chat/jinja.h"
#include "kvgraph/error.h"
#include "kvgraph/model_config.h"
#include "kvgraph/safetensors.h"
#include "kvgraph/tokenizer.h"

#include "support/files.h"
#include "support/temp_dir.h"

namespace kvgraph {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using kvgraph::testing::read_file;
using kvgraph::testing::safetensors_bytes;
using kvgraph::testing::TempDir;
using kvgraph::testing::write_bytes;

std::vector<fs::path> regressions(const std::string& target) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fs::path(KVGRAPH_SOURCE_DIR) / "tests/fuzz/regressions" / target)) {
    out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Runs `load` and reports anything but success or kvgraph::Error as a failure.
template <typename F>
void expect_error_or_success(const fs::path& input, F&& load) {
  SCOPED_TRACE(input.string());
  try {
    load();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << "escaped as another exception: " << e.what();
  }
}

TEST(FuzzRegressions, SafetensorsInputsFailCleanly) {
  const auto inputs = regressions("safetensors");
  ASSERT_FALSE(inputs.empty());
  for (const fs::path& p : inputs) {
    expect_error_or_success(p, [&] {
      const SafetensorsFile f(p);
      for (const std::string& name : f.names()) (void)f.get(name);
    });
  }
}

TEST(FuzzRegressions, ModelConfigInputsFailCleanly) {
  const auto inputs = regressions("model_config");
  ASSERT_FALSE(inputs.empty());
  for (const fs::path& p : inputs) expect_error_or_success(p, [&] { (void)load_model_config(p); });
}

TEST(FuzzRegressions, ChatTemplateInputsFailCleanly) {
  const auto inputs = regressions("chat_template");
  ASSERT_FALSE(inputs.empty());
  for (const fs::path& p : inputs) {
    // chat_template_fuzz.cpp's layout: TEMPLATE [ '\0' CONTEXT_JSON ].
    const std::string bytes = read_file(p);
    const std::string source = bytes.substr(0, bytes.find('\0'));
    expect_error_or_success(p, [&] {
      (void)chat::jinja::Template::parse(source).render({{"messages", nlohmann::ordered_json::array()}});
    });
  }
}

// The first chat_template crash: a namespace holding itself, printed, recursed
// without end. Python prints the inner one as {...}; so does kvgraph.
TEST(FuzzRegressions, ANamespaceHoldingItselfPrintsAsPythonPrintsIt) {
  EXPECT_EQ(chat::jinja::Template::parse("{% set t = namespace(a=1) %}{% set t.b = t %}{{ t }}")
                .render(nlohmann::ordered_json::object()),
            "<Namespace {'a': 1, 'b': <Namespace {...}>}>");
}

TEST(FuzzRegressions, TokenizerInputsFailCleanly) {
  const auto inputs = regressions("tokenizer");
  ASSERT_FALSE(inputs.empty());
  for (const fs::path& p : inputs) {
    // tokenizer_fuzz.cpp's layout: TOKENIZER_JSON [ '\0' TEXT [ '\0' TOKENIZER_CONFIG_JSON ] ].
    const std::string bytes = read_file(p);
    const size_t a = bytes.find('\0');
    const size_t b = a == std::string::npos ? a : bytes.find('\0', a + 1);
    const std::string json = bytes.substr(0, a);
    const std::string text = a == std::string::npos ? "Hello world" : bytes.substr(a + 1, b - a - 1);
    const std::string config = b == std::string::npos ? "" : bytes.substr(b + 1);
    expect_error_or_success(p, [&] {
      const Tokenizer tok = Tokenizer::from_json(json, config);
      const std::vector<int32_t> ids = tok.encode(text);
      for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < tok.vocab_size()) << "id " << id;
      (void)tok.decode(ids);
    });
  }
}

// nlohmann reports a number beyond double's range (1e999) as out_of_range.406,
// not parse_error; the parsers caught only parse_error, so it escaped and ended
// the process (found by all three fuzz targets within seconds).
TEST(FuzzRegressions, NumberBeyondDoubleRangeIsAnErrorInSafetensorsHeader) {
  TempDir dir;
  const fs::path p = dir.path() / "model.safetensors";
  write_bytes(p, safetensors_bytes(R"({"__metadata__": {"x": 1e999}})", ""));
  try {
    SafetensorsFile f(p);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[safetensors] "));
    EXPECT_THAT(e.what(), HasSubstr("header is not valid JSON"));
    EXPECT_THAT(e.what(), HasSubstr("number overflow"));
  }
}

TEST(FuzzRegressions, NumberBeyondDoubleRangeIsAnErrorInShardIndex) {
  TempDir dir;
  write_bytes(dir.path() / "model.safetensors.index.json", R"({"metadata": {"total_size": 1e999}, "weight_map": {}})");
  try {
    WeightStore w(dir.path());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[safetensors] "));
    EXPECT_THAT(e.what(), HasSubstr("number overflow"));
  }
}

TEST(FuzzRegressions, NumberBeyondDoubleRangeIsAnErrorInConfig) {
  const char* text = R"({"model_type": "llama", "rope_theta": 1e999})";
  try {
    (void)parse_model_config(text);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[config] config.json: malformed JSON: "));
    EXPECT_THAT(e.what(), HasSubstr("number overflow"));
  }
  TempDir dir;
  write_bytes(dir.path() / "config.json", text);
  try {
    (void)load_model_config(dir.path());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("config.json: malformed JSON: "));
  }
}

// model_config fuzzer, 2026-12-03: a llama3 rope_scaling whose
// original_max_position_embeddings (a JSON number) was past INT32_MAX was
// cast to int (undefined behaviour, UBSan); now it must be a positive
// integer an int holds.
TEST(FuzzRegressions, Llama3OriginalMaxPositionEmbeddingsOutOfIntRangeIsAnError) {
  for (const char* value : {"9223372036854775807", "8.9e22", "0", "-5", "2048.5"}) {
    const std::string text =
        std::string(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1, )") +
        R"("intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 512, "rope_scaling": )" +
        R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, )" +
        R"("original_max_position_embeddings": )" + value + "}}";
    try {
      (void)parse_model_config(text);
      FAIL() << value << ": no error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("original_max_position_embeddings must be a positive integer")) << value;
    }
  }
}

TEST(FuzzRegressions, NumberBeyondDoubleRangeIsAnErrorInTokenizerJson) {
  try {
    (void)Tokenizer::from_json(R"({"model": {"type": "BPE", "dropout": -1e999, "vocab": {}, "merges": []}})");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[tokenizer] tokenizer.json: number overflow parsing '-1e999'");
  }
  try {
    (void)Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})", R"({"x": 1E400})");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[tokenizer] tokenizer_config.json: number overflow parsing '1E400'");
  }
}

// A post-processor (TemplateProcessing here) naming an id that no token has:
// encode(text, true) handed it out although it is past vocab_size(), the rows
// an embedding table is promised to need (found by tokenizer_fuzz in 60 s).
TEST(FuzzRegressions, PostProcessorIdWithoutTokenIsAnError) {
  const std::string json = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
      "post_processor": {"type": "TemplateProcessing",
                         "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
                         "special_tokens": {"<s>": {"id": "<s>", "ids": [1000]}}}})";
  try {
    (void)Tokenizer::from_json(json);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "[tokenizer] tokenizer.json: post_processor: token id 1000 is in neither the vocabulary nor "
                 "added_tokens");
  }
  // The same id as an added token is fine.
  std::string with_added = json;
  with_added.insert(1, R"("added_tokens": [{"id": 1000, "content": "<s>", "special": true}], )");
  const Tokenizer tok = Tokenizer::from_json(with_added);
  EXPECT_EQ(tok.vocab_size(), 1001);
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{1000, 0, 1}));
}

// Token ids size the token table (largest id + 1): an id of 2^31 - 1 overflowed
// that size (UBSan: signed overflow), and one sparse id of 2e9 asked for 64 GB
// (found by probing tokenizer_fuzz's contract by hand, past libFuzzer's reach).
TEST(FuzzRegressions, HugeTokenIdsAreAnError) {
  try {
    (void)Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 2147483647}, "merges": []}})");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[tokenizer] tokenizer.json: model.vocab: token id 2147483647 is larger than the limit "
                           "16777215");
  }
  try {
    (void)Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                   "added_tokens": [{"id": 2000000000, "content": "x"}]})");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("added_tokens[0]: token id 2000000000 is larger than the limit"));
  }
  // Gemma 3's 262,144-token vocabulary is well inside the limit.
  const Tokenizer tok = Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                                 "added_tokens": [{"id": 262143, "content": "x"}]})");
  EXPECT_EQ(tok.vocab_size(), 262144);
}

// nlohmann parses iteratively, but dump() (each parser's error messages),
// copies and the tokenizer's recursive component readers are not: 10^5 nested
// brackets overflowed the stack in all three parsers (found by feeding the fuzz
// targets deeper inputs than libFuzzer's length limit lets them build).
std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(FuzzRegressions, DeeplyNestedSafetensorsHeaderIsAnError) {
  TempDir dir;
  const fs::path p = dir.path() / "model.safetensors";
  write_bytes(p, safetensors_bytes(R"({"a": )" + nested(100000) + "}", ""));
  try {
    SafetensorsFile f(p);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[safetensors] "));
    EXPECT_THAT(e.what(), HasSubstr("JSON nested deeper than 64 levels"));
  }
  write_bytes(dir.path() / "model.safetensors.index.json", R"({"weight_map": {}, "x": )" + nested(100000) + "}");
  fs::remove(p);
  EXPECT_THROW(WeightStore{dir.path()}, Error);
}

TEST(FuzzRegressions, DeeplyNestedConfigIsAnError) {
  try {
    (void)parse_model_config(R"({"model_type": "llama", "vocab_size": )" + nested(100000) + "}");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[config] config.json: JSON nested deeper than 64 levels");
  }
  // Nesting a real config could have is fine: the limit only stops runaway input.
  EXPECT_NO_THROW((void)parse_model_config(R"({"model_type": "llama", "x": )" + nested(60) + "}"));
}

TEST(FuzzRegressions, DeeplyNestedTokenizerJsonIsAnError) {
  std::string normalizer;
  for (int i = 0; i < 20000; ++i) normalizer += R"({"type": "Sequence", "normalizers": [)";
  normalizer += "null";
  for (int i = 0; i < 20000; ++i) normalizer += "]}";
  try {
    (void)Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": )" +
                               normalizer + "}");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[tokenizer] tokenizer.json: JSON nested deeper than 64 levels");
  }
  EXPECT_THROW((void)Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})",
                                          "{\"x\": " + nested(100000) + "}"),
               Error);
}

}  // namespace
}  // namespace kvgraph
