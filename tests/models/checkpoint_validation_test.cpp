// A checkpoint that does not match its config, or a config that makes no
// sense, fails at load with one message that says what is wrong, before any
// weight is read: never a silent model, a misleading message or minutes of
// work first (issue 12).
#include <sys/resource.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/safetensors.h"
#include "kvgraph/tokenizer.h"
#include "models/family.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/fixtures.h"
#include "support/run.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// One stored tensor: its header entry without offsets, and its bytes.
struct Stored {
  std::string name;
  json entry;  // {"dtype", "shape"}
  std::string bytes;
};

std::vector<Stored> read_tensors(const fs::path& file) {
  const SafetensorsParts parts = read_safetensors(file);
  std::vector<Stored> out;
  for (auto it = parts.header.begin(); it != parts.header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto begin = it.value()["data_offsets"][0].get<size_t>(), end = it.value()["data_offsets"][1].get<size_t>();
    out.push_back({it.key(), {{"dtype", it.value()["dtype"]}, {"shape", it.value()["shape"]}},
                   parts.data.substr(begin, end - begin)});
  }
  return out;
}

// Writes the header by hand, so a name may appear twice (a JSON object cannot hold that).
void write_tensors(const fs::path& file, const std::vector<Stored>& tensors) {
  std::string header = "{", data;
  for (const Stored& t : tensors) {
    json e = t.entry;
    e["data_offsets"] = {data.size(), data.size() + t.bytes.size()};
    header += (header.size() > 1 ? "," : "") + json(t.name).dump() + ":" + e.dump();
    data += t.bytes;
  }
  write_bytes(file, safetensors_bytes(header + "}", data));
}

// A copy of a model directory (a fixture or the embedded model) that a test may change.
fs::path copy_model(const fs::path& src, const TempDir& dir) {
  const fs::path dst = dir.path() / "model";
  fs::copy(src, dst, fs::copy_options::recursive);
  return dst;
}

void edit_config(const fs::path& dir, const std::function<void(json&)>& edit) {
  json c = json::parse(read_file(dir / "config.json"));
  edit(c);
  std::ofstream(dir / "config.json") << c.dump(2);
}

std::string load_error(const fs::path& dir, int* progress_calls = nullptr) {
  return error_of([&] {
    Model::load(dir, Device::CPU, [&](size_t, size_t) {
      if (progress_calls) ++*progress_calls;
    });
  });
}

std::string config_error(const std::string& text) {
  return error_of([&] { parse_model_config(text); });
}

fs::path default_model() { return fs::path(KVGRAPH_SOURCE_DIR) / "models" / "default"; }

// One past the largest id in tokenizer.json's model vocabulary and added
// tokens, read straight from the JSON (not through kvgraph's tokenizer).
int32_t tokenizer_json_size(const fs::path& file) {
  const json t = json::parse(read_file(file));
  int32_t n = 0;
  for (const auto& [token, id] : t["model"]["vocab"].items()) n = std::max(n, id.get<int32_t>() + 1);
  for (const json& a : t["added_tokens"]) n = std::max(n, a["id"].get<int32_t>() + 1);
  return n;
}

}  // namespace

// ------------------------------------------------ finding 1: tokenizer vs vocab_size

TEST(TokenizerVocab, IdsBeyondTheConfigVocabSizeAreAnErrorNamingBothFilesAndNumbers) {
  TempDir dir;
  const fs::path m = copy_model(default_model(), dir);
  const int32_t n = tokenizer_json_size(m / "tokenizer.json");
  ASSERT_EQ(n, 4096);
  edit_config(m, [](json& c) { c["vocab_size"] = 4000; });
  try {
    check_vocab(Tokenizer::from_file(m), load_model_config(m));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[tokenizer] " + (m / "tokenizer.json").string()));
    EXPECT_THAT(e.what(), HasSubstr("token ids up to 4095"));
    EXPECT_THAT(e.what(), HasSubstr((m / "config.json").string() + " has vocab_size 4000"));
  }
}

TEST(TokenizerVocab, AVocabSizePaddedPastTheTokenizerIsFine) {
  TempDir dir;
  const fs::path m = copy_model(default_model(), dir);
  for (int v : {4096, 4160}) {  // exact, and padded to a multiple of 64 as some exporters do
    edit_config(m, [&](json& c) { c["vocab_size"] = v; });
    const Tokenizer t = check_vocab(Tokenizer::from_file(m), load_model_config(m));
    EXPECT_EQ(t.encode("hello", false), Tokenizer::from_file(m).encode("hello", false)) << v;
  }
}

TEST(TokenizerVocab, TheCliRefusesATokenizerFromAnotherModel) {
  // A consistent 4000-row checkpoint (embedding cut to 4000 rows) with the
  // 4096-token tokenizer: the tokenizer's ids 4000..4095 have no row.
  TempDir dir;
  const fs::path m = copy_model(default_model(), dir);
  edit_config(m, [](json& c) { c["vocab_size"] = 4000; });
  std::vector<Stored> tensors = read_tensors(m / "model.safetensors");
  for (Stored& t : tensors) {
    if (t.name != "model.embed_tokens.weight") continue;
    const int64_t cols = t.entry["shape"][1].get<int64_t>();
    t.bytes.resize(size_t(4000 * cols) * (t.bytes.size() / size_t(4096 * cols)));
    t.entry["shape"][0] = 4000;
  }
  write_tensors(m / "model.safetensors", tensors);
  ASSERT_EQ(load_error(m), "");  // the checkpoint itself is fine

  const RunResult r = run_cli("generate -m " + m.string() + " hello --max-tokens 2 -q");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("kvgraph: error: [tokenizer] " + (m / "tokenizer.json").string() +
                               " has token ids up to 4095 but " + (m / "config.json").string() +
                               " has vocab_size 4000"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// ------------------------------------------------ finding 2: windows and families

TEST(SlidingWindow, AWindowOfZeroOrLessForSlidingLayersIsAnErrorNamingIt) {
  for (const char* cfg : {R"({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 0})",
                          R"({"model_type": "gemma2", "num_hidden_layers": 2, "sliding_window": 0})",
                          R"({"model_type": "gemma3_text", "num_hidden_layers": 2, "sliding_window": 0})",
                          R"({"model_type": "qwen2", "num_hidden_layers": 2, "use_sliding_window": true,
                              "max_window_layers": 1, "sliding_window": 0})",
                          R"({"model_type": "qwen3", "num_hidden_layers": 2, "use_sliding_window": true,
                              "layer_types": ["full_attention", "sliding_attention"], "sliding_window": 0})"}) {
    EXPECT_THAT(config_error(cfg), HasSubstr("\"sliding_window\" must be a positive integer")) << cfg;
    EXPECT_THAT(config_error(cfg), HasSubstr("found 0")) << cfg;
  }
  EXPECT_THAT(config_error(R"({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": -4096})"),
              HasSubstr("\"sliding_window\" must be a positive integer (layer 0 slides), found -4096"));
}

TEST(SlidingWindow, ANullWindowForLayersThatSlideIsAnError) {
  // transformers refuses it too ("Could not find a `sliding_window` argument").
  EXPECT_THAT(config_error(R"({"model_type": "gemma2", "num_hidden_layers": 2, "sliding_window": null})"),
              HasSubstr("\"sliding_window\" must be a positive integer (layer 0 slides), found null"));
  EXPECT_THAT(config_error(R"({"model_type": "qwen2", "num_hidden_layers": 2, "use_sliding_window": true,
      "layer_types": ["full_attention", "sliding_attention"], "sliding_window": null})"),
              HasSubstr("(layer 1 slides), found null"));
}

TEST(SlidingWindow, WindowsTransformersIgnoresStayLegal) {
  // Mistral 7B v0.2+: null is full attention. Qwen2/3 drop the window unless
  // use_sliding_window, and slide nothing when it is null. Llama never reads it.
  for (const char* cfg : {R"({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": null})",
                          R"({"model_type": "qwen2", "num_hidden_layers": 2, "use_sliding_window": false,
                              "sliding_window": 0})",
                          R"({"model_type": "qwen2", "num_hidden_layers": 2, "use_sliding_window": false,
                              "sliding_window": null, "layer_types": ["sliding_attention", "full_attention"]})",
                          R"({"model_type": "qwen2", "num_hidden_layers": 2, "use_sliding_window": true,
                              "sliding_window": null})",
                          R"({"model_type": "qwen3", "num_hidden_layers": 2, "sliding_window": -1})",
                          R"({"model_type": "llama", "num_hidden_layers": 2, "sliding_window": 0})"}) {
    ModelConfig c;
    ASSERT_NO_THROW(c = parse_model_config(cfg)) << cfg;
    EXPECT_EQ(c.layer_window, std::vector<int>(2, 0)) << cfg;
    EXPECT_EQ(c.sliding_window, 0) << cfg;
  }
}

TEST(WrongFamily, AGemmaCheckpointReadAsLlamaFails) {
  // Gemma 2 as Llama is covered in unused_tensors_test.cpp; Gemma 3 adds q/k norms.
  for (const char* type : {"llama", "mistral", "qwen2", "gemma2"}) {
    TempDir dir;
    const fs::path m = copy_model(fixtures_dir() / "gemma3", dir);
    edit_config(m, [&](json& c) { c["model_type"] = type; });
    const std::string e = load_error(m);
    EXPECT_THAT(e, HasSubstr("not used by the model config.json describes")) << type;
    EXPECT_THAT(e, HasSubstr(type == std::string("gemma2") ? "self_attn.k_norm" : "layernorm")) << type;
  }
}

// ------------------------------------------------ finding 3: honest messages

TEST(HonestMessages, AFileGivenForTheModelDirectoryIsNamedAsSuch) {
  const fs::path dir = fixtures_dir() / "llama";
  for (const char* file : {"config.json", "model.safetensors"}) {
    const std::string e = load_error(dir / file);
    EXPECT_THAT(e, HasSubstr("[model] expected a model directory")) << file;
    EXPECT_THAT(e, HasSubstr("got the file " + (dir / file).string() + "; pass its directory " + dir.string()));
    EXPECT_THAT(e, Not(HasSubstr("JSON"))) << e;
    EXPECT_THAT(e, Not(HasSubstr("header length"))) << e;
  }
  EXPECT_THAT(load_error(dir / "absent"), HasSubstr("[model] model directory " + (dir / "absent").string() +
                                                    " does not exist"));
}

TEST(HonestMessages, ATensorInTwoShardsIsNamedWithBothShards) {
  TempDir dir;
  const fs::path m = dir.path();
  fs::copy_file(fixtures_dir() / "llama" / "config.json", m / "config.json");
  const std::vector<Stored> all = read_tensors(fixtures_dir() / "llama" / "model.safetensors");
  const size_t half = all.size() / 2;
  std::vector<Stored> a(all.begin(), all.begin() + half), b(all.begin() + half, all.end());
  b.push_back(all.front());  // also in the second shard
  write_tensors(m / "a.safetensors", a);
  write_tensors(m / "b.safetensors", b);
  json map = json::object();
  for (const Stored& t : a) map[t.name] = "a.safetensors";
  for (size_t i = half; i < all.size(); ++i) map[all[i].name] = "b.safetensors";
  std::ofstream(m / "model.safetensors.index.json") << json({{"weight_map", map}}).dump();

  EXPECT_THAT(load_error(m), HasSubstr("tensor \"" + all.front().name +
                                       "\" appears in both a.safetensors and b.safetensors"));
  b.pop_back();  // the same shards without the copy load
  write_tensors(m / "b.safetensors", b);
  EXPECT_EQ(load_error(m), "");
}

TEST(HonestMessages, ATensorTwiceInOneHeaderIsNamedNotReportedAsAGap) {
  TempDir dir;
  const fs::path m = copy_model(fixtures_dir() / "llama", dir);
  std::vector<Stored> all = read_tensors(m / "model.safetensors");
  all.push_back(all.front());
  write_tensors(m / "model.safetensors", all);
  const std::string e = load_error(m);
  EXPECT_THAT(e, HasSubstr("[safetensors] " + (m / "model.safetensors").string() + ": tensor \"" +
                           all.front().name + "\" appears twice in the header"));
  EXPECT_THAT(e, Not(HasSubstr("gap")));
  EXPECT_THAT(e, Not(HasSubstr("contiguous")));
}

// ------------------------------------------------ finding 4: validate before work

TEST(ValidateFirst, SizesOutsideTheLimitsFailWhileParsing) {
  struct Case {
    const char* key;
    int64_t value;
  };
  for (const Case& c : {Case{"num_hidden_layers", 1000000000}, Case{"num_hidden_layers", 1025},
                        Case{"num_attention_heads", 1025}, Case{"num_key_value_heads", 4096},
                        Case{"hidden_size", (1 << 17) + 1}, Case{"intermediate_size", (1 << 20) + 1},
                        Case{"vocab_size", (1 << 24) + 1}, Case{"head_dim", 1026},
                        Case{"num_hidden_layers", 5000000000}}) {
    const json cfg = {{"model_type", "llama"}, {c.key, c.value}};
    const std::string e = config_error(cfg.dump());
    EXPECT_THAT(e, HasSubstr("\"" + std::string(c.key) + "\" must be at most")) << c.key << " " << c.value;
    EXPECT_THAT(e, HasSubstr("found " + std::to_string(c.value))) << e;
  }
  // A head_dim derived from hidden_size / num_attention_heads is limited too.
  EXPECT_THAT(config_error(R"({"model_type": "llama", "hidden_size": 8192, "num_attention_heads": 2})"),
              HasSubstr("head_dim 4096 (\"hidden_size\" / \"num_attention_heads\") is above the limit 1024"));
  // The largest published shapes are inside them.
  EXPECT_NO_THROW(parse_model_config(R"({"model_type": "llama", "num_hidden_layers": 126, "hidden_size": 16384,
      "intermediate_size": 53248, "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256})"));
}

TEST(ValidateFirst, ANumHiddenLayersTypoFailsAtOnceFromTheCli) {
  // It used to allocate gigabytes of tensor plans (4 s, 3.9 GB) and die of std::bad_alloc.
  TempDir dir;
  const fs::path m = copy_model(fixtures_dir() / "llama", dir);
  edit_config(m, [](json& c) { c["num_hidden_layers"] = 1e9; });
  const RunResult r = run_cli("generate -m " + m.string() + " --prompt-ids 1 --max-tokens 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kvgraph: error: [config] " + (m / "config.json").string() +
                               ": \"num_hidden_layers\" must be at most 1024 (the supported limit), found 1000000000"));
}

TEST(ValidateFirst, TheLastTensorIsCheckedBeforeTheFirstIsRead) {
  // The last tensor the loader makes, with a wrong shape, a non-float dtype,
  // or missing: the error comes before any weight is read (progress is
  // reported after each tensor read).
  const ModelConfig cfg = load_model_config(fixtures_dir() / "llama");
  const std::string last = plan_weights(cfg, {}).back().parts.back().name;
  struct Damage {
    std::function<void(std::vector<Stored>&)> apply;
    std::string message;
  };
  const std::vector<Damage> damages = {
      {[&](std::vector<Stored>& ts) {
         for (Stored& t : ts)
           if (t.name == last) t.entry["shape"] = {t.bytes.size() / 8, 2};
       },
       "tensor \"" + last + "\": expected shape"},
      {[&](std::vector<Stored>& ts) {
         for (Stored& t : ts)
           if (t.name == last) t.entry["dtype"] = "I32";
       },
       "tensor \"" + last + "\": dtype i32 is not a float type"},
      {[&](std::vector<Stored>& ts) { std::erase_if(ts, [&](const Stored& t) { return t.name == last; }); },
       "missing tensor \"" + last + "\""},
  };
  for (const Damage& d : damages) {
    TempDir dir;
    const fs::path m = copy_model(fixtures_dir() / "llama", dir);
    std::vector<Stored> ts = read_tensors(m / "model.safetensors");
    d.apply(ts);
    write_tensors(m / "model.safetensors", ts);
    int progress_calls = 0;
    EXPECT_THAT(load_error(m, &progress_calls), HasSubstr(d.message));
    EXPECT_EQ(progress_calls, 0) << d.message;
    EXPECT_THAT([&] { Model::describe(m, Device::CPU); }, ::testing::Throws<Error>()) << d.message;
  }
}

TEST(ValidateFirst, DescribeReportsWhatLoadBuilds) {
  for (const auto& fam : fixture_families()) {
    for (auto cw : {Model::CpuWeights::f32, Model::CpuWeights::bf16}) {
      const ModelInfo info = Model::describe(fixtures_dir() / fam, Device::CPU, cw);
      const auto m = Model::load(fixtures_dir() / fam, Device::CPU, {}, cw);
      EXPECT_EQ(info.weight_bytes, m->weight_bytes()) << fam;
      EXPECT_EQ(info.matrix_dtype, m->matrix_dtype()) << fam;
      EXPECT_EQ(info.config.layer_window, m->config().layer_window) << fam;
      // Every tensor of the fixtures is read (none has a tied lm_head stored).
      EXPECT_EQ(info.checkpoint_bytes, read_safetensors(fixtures_dir() / fam / "model.safetensors").data.size()) << fam;
    }
  }
  // The embedded model is stored in bf16: the CPU keeps it in bf16 when asked.
  const ModelInfo d = Model::describe(default_model(), Device::CPU, Model::CpuWeights::bf16);
  EXPECT_EQ(d.matrix_dtype, DType::BF16);
  EXPECT_EQ(d.weight_bytes, Model::load(default_model(), Device::CPU, {}, Model::CpuWeights::bf16)->weight_bytes());
}

TEST(ValidateFirst, SyntheticSizesComeFromTheConfigAlone) {
  // Llama 3.2 1B has 1,235,814,400 parameters (tied embeddings), 16 x 2 + 1
  // norms of 2048 among them; the CPU holds all in f32, CUDA the matrices in bf16.
  const size_t params = 1235814400, norm_params = (16 * 2 + 1) * 2048;
  EXPECT_EQ(Model::describe_synthetic("llama3.2-1b", Device::CPU).weight_bytes, params * 4);
  const ModelInfo cuda = Model::describe_synthetic("llama3.2-1b", Device::CUDA);
  EXPECT_EQ(cuda.weight_bytes, (params - norm_params) * 2 + norm_params * 4);
  EXPECT_EQ(cuda.matrix_dtype, DType::BF16);
  EXPECT_TRUE(cuda.dir.empty());
  EXPECT_THROW(Model::describe_synthetic("nope", Device::CPU), Error);
  // Quantized (benchmarks): every matrix of the 1B divides into groups of 64;
  // 4-bit codes plus a bf16 scale and bias per group of 64.
  const size_t matrix_params = params - norm_params;
  const ModelInfo q4 = Model::describe_synthetic("llama3.2-1b", Device::CUDA, QuantFormat{4, 64});
  EXPECT_EQ(q4.weight_bytes, matrix_params / 2 + matrix_params / 64 * 2 * 2 + norm_params * 4);
  EXPECT_EQ(q4.quantization, (QuantFormat{4, 64}));
  EXPECT_THROW(Model::describe_synthetic("llama3.2-1b", Device::CUDA, QuantFormat{3, 64}), Error);
}

// ------------------------------------------------ finding 5: non-finite weights

TEST(NonFinite, FirstNonFiniteFindsNanAndInfinityInEachFloatType) {
  auto view = [](DType dt, const void* data, int64_t n) {
    WeightView v;
    v.name = "t";
    v.dtype = dt;
    v.shape = {n};
    v.data = static_cast<const std::byte*>(data);
    v.nbytes = size_t(n) * dtype_size(dt);
    return v;
  };
  std::vector<float> f(10000, 1.5f);
  EXPECT_EQ(first_non_finite(view(DType::F32, f.data(), 10000)), std::nullopt);
  f[9000] = -INFINITY;
  f[9001] = NAN;
  EXPECT_EQ(first_non_finite(view(DType::F32, f.data(), 10000)), 9000);
  f[7] = std::numeric_limits<float>::max();  // large but finite
  EXPECT_EQ(first_non_finite(view(DType::F32, f.data(), 10000)), 9000);
  // 16-bit values by their bit patterns: bf16 NaN 0x7FC0, +inf 0x7F80; f16 +inf 0x7C00, max 0x7BFF.
  std::vector<uint16_t> h(5000, 0x3F80);
  EXPECT_EQ(first_non_finite(view(DType::BF16, h.data(), 5000)), std::nullopt);
  h[4999] = 0x7FC0;
  EXPECT_EQ(first_non_finite(view(DType::BF16, h.data(), 5000)), 4999);
  std::vector<uint16_t> g(100, 0x7BFF);
  EXPECT_EQ(first_non_finite(view(DType::F16, g.data(), 100)), std::nullopt);
  g[3] = 0xFC00;  // -inf
  EXPECT_EQ(first_non_finite(view(DType::F16, g.data(), 100)), 3);
  const int32_t ints[2] = {0x7F800000, -1};  // integers are never "non-finite"
  EXPECT_EQ(first_non_finite(view(DType::I32, ints, 2)), std::nullopt);
}
