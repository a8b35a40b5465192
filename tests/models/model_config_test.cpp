// config.json parsing: each family's transformers defaults from a minimal
// file, both RoPE spellings, sliding-window layer patterns, RoPE inverse
// frequencies against the formulas, and one clear error per bad input.
#include "kvgraph/model_config.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/error.h"
#include "support/errors.h"

namespace kvgraph {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string error_of(const std::string& json_text) {
  return kvgraph::testing::error_of([&] { parse_model_config(json_text); });
}

// ------------------------------------------------------------- defaults

TEST(ModelConfig, LlamaDefaultsFromMinimalConfig) {
  ModelConfig c = parse_model_config(R"({"model_type": "llama"})");
  EXPECT_EQ(c.family, Family::Llama);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 32);  // None -> num_attention_heads
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.attention_out_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.activation, Activation::SiLU);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_EQ(c.rope.theta, 10000.0f);
  EXPECT_EQ(c.rope_local.theta, 10000.0f);
  EXPECT_EQ(c.layer_window, std::vector<int>(32, 0));
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));
  EXPECT_EQ(c.weight_dtype, DType::F32);
  EXPECT_EQ(c.embed_scale, 1.0f);
  EXPECT_FALSE(c.norm_weight_plus_one);
  EXPECT_FALSE(c.sandwich_norms);
  EXPECT_EQ(c.attn_logit_softcap, 0.0f);
  EXPECT_EQ(c.final_logit_softcap, 0.0f);
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / std::sqrt(128.0f));
  EXPECT_FALSE(c.nested_text_config);
}

TEST(ModelConfig, LlamaLegacyRopeScalingBiasesAndExplicitHeadDim) {
  ModelConfig c = parse_model_config(R"({
    "model_type": "llama", "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 4,
    "head_dim": 64, "num_hidden_layers": 2, "attention_bias": true, "mlp_bias": true,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "eos_token_id": [128001, 128008, 128009], "bos_token_id": 128000, "torch_dtype": "bfloat16",
    "tie_word_embeddings": true
  })");
  EXPECT_EQ(c.head_dim, 64);  // explicit, not 2048 / 16
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.attention_out_bias);
  EXPECT_TRUE(c.mlp_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_EQ(c.rope.theta, 500000.0f);
  EXPECT_EQ(c.rope.factor, 32.0f);
  EXPECT_EQ(c.rope.low_freq_factor, 1.0f);
  EXPECT_EQ(c.rope.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.weight_dtype, DType::BF16);
  EXPECT_EQ(c.embed_scale, 1.0f);  // only Gemma scales embeddings
}

TEST(ModelConfig, LlamaRopeParametersSpelling) {
  // transformers v5: rope_theta lives inside rope_parameters; a missing
  // original_max_position_embeddings defaults to max_position_embeddings.
  ModelConfig c = parse_model_config(R"({
    "model_type": "llama", "max_position_embeddings": 4096, "dtype": "float16",
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0}
  })");
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_EQ(c.rope.theta, 500000.0f);
  EXPECT_EQ(c.rope.factor, 8.0f);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.weight_dtype, DType::F16);

  // The older "type" key and a linear scaling.
  ModelConfig l = parse_model_config(
      R"({"model_type": "llama", "rope_theta": 1000.0, "rope_scaling": {"type": "linear", "factor": 2.0}})");
  EXPECT_EQ(l.rope.type, "linear");
  EXPECT_EQ(l.rope.theta, 1000.0f);
  EXPECT_EQ(l.rope.factor, 2.0f);

  // "dtype" wins over "torch_dtype".
  EXPECT_EQ(parse_model_config(R"({"model_type": "llama", "dtype": "float32", "torch_dtype": "bfloat16"})")
                .weight_dtype,
            DType::F32);
}

TEST(ModelConfig, Qwen2DefaultsHaveQkvBiasAndNoWindows) {
  ModelConfig c = parse_model_config(R"({"model_type": "qwen2", "num_hidden_layers": 4})");
  EXPECT_EQ(c.family, Family::Qwen2);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.intermediate_size, 22016);
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.attention_out_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.layer_window, std::vector<int>(4, 0));  // use_sliding_window defaults to false
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.bos_token_id, -1);
}

TEST(ModelConfig, Qwen2SlidingLayersFromMaxWindowLayers) {
  ModelConfig c = parse_model_config(R"({"model_type": "qwen2", "num_hidden_layers": 4,
    "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 2})");
  EXPECT_THAT(c.layer_window, ElementsAre(0, 0, 16, 16));
  EXPECT_EQ(c.sliding_window, 16);

  // Explicit layer_types win over the max_window_layers rule.
  ModelConfig t = parse_model_config(R"({"model_type": "qwen2", "num_hidden_layers": 3,
    "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 0,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})");
  EXPECT_THAT(t.layer_window, ElementsAre(8, 0, 8));

  // Without use_sliding_window, transformers drops the window even for "sliding_attention" layers.
  ModelConfig off = parse_model_config(R"({"model_type": "qwen2", "num_hidden_layers": 2,
    "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]})");
  EXPECT_THAT(off.layer_window, ElementsAre(0, 0));
}

TEST(ModelConfig, MistralSlidesEveryLayerByDefault) {
  ModelConfig c = parse_model_config(R"({"model_type": "mistral", "num_hidden_layers": 3})");
  EXPECT_EQ(c.family, Family::Mistral);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_THAT(c.layer_window, ElementsAre(4096, 4096, 4096));
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));

  ModelConfig w = parse_model_config(R"({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 16})");
  EXPECT_THAT(w.layer_window, ElementsAre(16, 16));

  // Mistral 7B v0.2+ writes "sliding_window": null: full attention.
  ModelConfig n = parse_model_config(R"({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": null})");
  EXPECT_THAT(n.layer_window, ElementsAre(0, 0));
  EXPECT_EQ(n.sliding_window, 0);
}

TEST(ModelConfig, Gemma2DefaultsAlternateWindowsAndSoftcap) {
  ModelConfig c = parse_model_config(R"({"model_type": "gemma2", "num_hidden_layers": 4})");
  EXPECT_EQ(c.family, Family::Gemma2);
  EXPECT_EQ(c.vocab_size, 256000);
  EXPECT_EQ(c.hidden_size, 2304);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_THAT(c.layer_window, ElementsAre(4096, 0, 4096, 0));  // layer i slides when (i + 1) % 2 != 0
  EXPECT_EQ(c.attn_logit_softcap, 50.0f);
  EXPECT_EQ(c.final_logit_softcap, 30.0f);
  EXPECT_EQ(c.query_pre_attn_scalar, 256.0f);
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / 16.0f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.norm_weight_plus_one);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.activation, Activation::GeluTanh);
  EXPECT_EQ(c.embed_scale, 48.0f);  // sqrt(2304)
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(1));
  EXPECT_EQ(c.rope.theta, 10000.0f);

  ModelConfig n = parse_model_config(R"({"model_type": "gemma2", "num_hidden_layers": 2,
    "final_logit_softcapping": null, "attn_logit_softcapping": 20.0, "query_pre_attn_scalar": 144,
    "head_dim": 32, "hidden_size": 64})");
  EXPECT_EQ(n.final_logit_softcap, 0.0f);
  EXPECT_EQ(n.attn_logit_softcap, 20.0f);
  EXPECT_FLOAT_EQ(n.attention_scale(), 1.0f / 12.0f);  // query_pre_attn_scalar, not head_dim
  EXPECT_EQ(n.embed_scale, 8.0f);
}

TEST(ModelConfig, Gemma3TextDefaultsSlidingPatternOfSix) {
  ModelConfig c = parse_model_config(R"({"model_type": "gemma3_text", "num_hidden_layers": 12})");
  EXPECT_EQ(c.family, Family::Gemma3);
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_THAT(c.layer_window, ElementsAre(4096, 4096, 4096, 4096, 4096, 0, 4096, 4096, 4096, 4096, 4096, 0));
  EXPECT_EQ(c.rope.theta, 1000000.0f);
  EXPECT_EQ(c.rope_local.theta, 10000.0f);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_EQ(c.attn_logit_softcap, 0.0f);
  EXPECT_EQ(c.final_logit_softcap, 0.0f);
  EXPECT_EQ(c.query_pre_attn_scalar, 256.0f);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.norm_weight_plus_one);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_EQ(c.activation, Activation::GeluTanh);
  EXPECT_EQ(c.embed_scale, 48.0f);
}

TEST(ModelConfig, Gemma3LegacyRopeSpelling) {
  ModelConfig c = parse_model_config(R"({"model_type": "gemma3_text", "num_hidden_layers": 6,
    "sliding_window_pattern": 3, "sliding_window": 512, "rope_theta": 2000000.0,
    "rope_local_base_freq": 20000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "final_logit_softcapping": 30.0})");
  EXPECT_THAT(c.layer_window, ElementsAre(512, 512, 0, 512, 512, 0));
  EXPECT_EQ(c.rope.type, "linear");  // rope_scaling applies to global layers only
  EXPECT_EQ(c.rope.factor, 8.0f);
  EXPECT_EQ(c.rope.theta, 2000000.0f);
  EXPECT_EQ(c.rope_local.type, "default");
  EXPECT_EQ(c.rope_local.theta, 20000.0f);
  EXPECT_EQ(c.final_logit_softcap, 30.0f);
}

TEST(ModelConfig, Gemma3RopeParametersByLayerType) {
  ModelConfig c = parse_model_config(R"({"model_type": "gemma3_text", "num_hidden_layers": 4,
    "sliding_window": 12,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})");
  EXPECT_THAT(c.layer_window, ElementsAre(12, 12, 0, 12));
  EXPECT_EQ(c.rope.type, "linear");
  EXPECT_EQ(c.rope.factor, 2.0f);
  EXPECT_EQ(c.rope.theta, 1000000.0f);
  EXPECT_EQ(c.rope_local.type, "default");
  EXPECT_EQ(c.rope_local.theta, 10000.0f);

  // Missing thetas fall back to Gemma 3's defaults, per layer type.
  ModelConfig d = parse_model_config(R"({"model_type": "gemma3_text", "num_hidden_layers": 1,
    "rope_parameters": {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}}})");
  EXPECT_EQ(d.rope.theta, 1000000.0f);
  EXPECT_EQ(d.rope_local.theta, 10000.0f);
}

TEST(ModelConfig, Gemma3MultimodalReadsTextConfigAndRoundsEmbedScaleThroughBf16) {
  ModelConfig c = parse_model_config(R"({"model_type": "gemma3", "torch_dtype": "bfloat16",
    "eos_token_id": [1, 106], "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 2,
                    "head_dim": 256, "num_attention_heads": 8, "num_key_value_heads": 4,
                    "rope_scaling": {"rope_type": "linear", "factor": 8.0}}})");
  EXPECT_EQ(c.family, Family::Gemma3);
  EXPECT_EQ(c.model_type, "gemma3");
  EXPECT_TRUE(c.nested_text_config);
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.weight_dtype, DType::BF16);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(1, 106));
  EXPECT_EQ(c.rope.type, "linear");
  // sqrt(2560) = 50.596..., which bf16 holds as 50.5.
  EXPECT_EQ(c.embed_scale, 50.5f);
  EXPECT_EQ(c.embed_scale, bf16_to_f32(f32_to_bf16(std::sqrt(2560.0f))));

  // Errors inside text_config name the nested field.
  EXPECT_THAT(error_of(R"({"model_type": "gemma3", "text_config": {"num_attention_heads": "eight"}})"),
              HasSubstr("\"text_config.num_attention_heads\" must be an integer"));
}

TEST(ModelConfig, Qwen3DefaultsHaveExplicitHeadDimAndQkNorm) {
  ModelConfig c = parse_model_config(R"({"model_type": "qwen3", "hidden_size": 1024,
    "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 2, "tie_word_embeddings": true})");
  EXPECT_EQ(c.family, Family::Qwen3);
  EXPECT_EQ(c.head_dim, 128);  // Qwen3Config default, not 1024 / 16
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.norm_weight_plus_one);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_THAT(c.layer_window, ElementsAre(0, 0));
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / std::sqrt(128.0f));
}

TEST(ModelConfig, LoadsFromDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvgraph_model_config_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "config.json");
    out << R"({"model_type": "qwen3", "num_hidden_layers": 3, "vocab_size": 256})";
  }
  ModelConfig c = load_model_config(dir);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.vocab_size, 256);
  {
    std::ofstream out(dir / "config.json");
    out << "{\n  \"model_type\": \"qwen3\",\n  \"vocab_size\": 256,\n}";
  }
  try {
    load_model_config(dir);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[config] " + (dir / "config.json").string() + ": malformed JSON at byte"));
  }
  std::filesystem::remove_all(dir);
  try {
    load_model_config(dir);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[config] cannot open " + (dir / "config.json").string()));
  }
}

// ------------------------------------------------------------------ errors

TEST(ModelConfigErrors, UnknownOrMissingModelType) {
  EXPECT_THAT(error_of(R"({"model_type": "bert"})"),
              HasSubstr("[config] config.json: unknown model_type \"bert\" (supported: llama, qwen2, mistral, gemma2, "
                        "gemma3_text, qwen3)"));
  EXPECT_THAT(error_of(R"({"hidden_size": 4})"), HasSubstr("missing \"model_type\""));
  EXPECT_THAT(error_of(R"([1, 2])"), HasSubstr("expected a JSON object"));
}

TEST(ModelConfigErrors, MalformedJsonGivesBytePosition) {
  EXPECT_THAT(error_of("{\"model_type\": \"llama\",, }"), HasSubstr("[config] config.json: malformed JSON at byte 24"));
}

TEST(ModelConfigErrors, HeadsNotDivisibleByKvHeads) {
  EXPECT_EQ(error_of(R"({"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 5})"),
            "[config] config.json: \"num_attention_heads\" (32) is not divisible by \"num_key_value_heads\" (5)");
}

TEST(ModelConfigErrors, BadFieldValuesAreNamed) {
  EXPECT_THAT(error_of(R"({"model_type": "llama", "num_attention_heads": "32"})"),
              HasSubstr("\"num_attention_heads\" must be an integer, found \"32\""));
  EXPECT_THAT(error_of(R"({"model_type": "llama", "vocab_size": -3})"),
              HasSubstr("\"vocab_size\" must be a positive integer, found -3"));
  EXPECT_THAT(error_of(R"({"model_type": "llama", "hidden_size": 100, "num_attention_heads": 3})"),
              HasSubstr("\"hidden_size\" (100) is not divisible by \"num_attention_heads\" (3)"));
  EXPECT_THAT(error_of(R"({"model_type": "llama", "torch_dtype": "int8"})"),
              HasSubstr("\"torch_dtype\" \"int8\" is not supported"));
  EXPECT_THAT(error_of(R"({"model_type": "llama", "hidden_act": "relu"})"),
              HasSubstr("\"hidden_act\" \"relu\" is not supported"));
  EXPECT_THAT(error_of(R"({"model_type": "llama", "eos_token_id": "eos"})"), HasSubstr("\"eos_token_id\" must be"));
}

TEST(ModelConfigErrors, UnsupportedRopeTypesAreNamed) {
  EXPECT_THAT(error_of(R"({"model_type": "qwen2", "rope_scaling": {"type": "yarn", "factor": 4.0}})"),
              HasSubstr("unsupported RoPE type \"yarn\" in \"rope_scaling\" (supported: default, linear, llama3)"));
  EXPECT_THAT(error_of(R"({"model_type": "llama", "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})"),
              HasSubstr("unsupported RoPE type \"dynamic\" in \"rope_parameters\""));
  EXPECT_THAT(error_of(R"({"model_type": "llama", "rope_scaling": {"rope_type": "longrope"}})"),
              HasSubstr("\"longrope\""));
  EXPECT_THAT(error_of(R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})"),
              HasSubstr("is missing \"low_freq_factor\""));
  EXPECT_THAT(error_of(R"({"model_type": "llama", "rope_scaling": {"rope_type": "linear"}})"),
              HasSubstr("is missing \"factor\""));
  EXPECT_THAT(error_of(R"({"model_type": "llama", "partial_rotary_factor": 0.5,
                          "rope_parameters": {"rope_theta": 1.0, "partial_rotary_factor": 0.5}})"),
              HasSubstr("partial_rotary_factor"));
}

TEST(ModelConfigErrors, BadLayerTypes) {
  EXPECT_THAT(error_of(R"({"model_type": "gemma2", "num_hidden_layers": 3,
                          "layer_types": ["sliding_attention", "full_attention"]})"),
              HasSubstr("\"layer_types\" has 2 entries but \"num_hidden_layers\" is 3"));
  EXPECT_THAT(error_of(R"({"model_type": "gemma3_text", "num_hidden_layers": 2,
                          "layer_types": ["sliding_attention", "chunked_attention"]})"),
              HasSubstr("\"layer_types\"[1] is \"chunked_attention\""));
}

// ------------------------------------------------------------------- RoPE

// Reference inverse frequencies in double precision, straight from the
// formulas (transformers' _compute_default_rope_parameters and
// _compute_llama3_parameters), written independently of the implementation.
std::vector<double> reference_inv_freq(double theta, int dim, const std::string& type, double factor = 1.0,
                                       double low = 1.0, double high = 4.0, double ocl = 8192.0) {
  std::vector<double> out;
  for (int i = 0; i < dim; i += 2) {
    const double inv = 1.0 / std::pow(theta, static_cast<double>(i) / dim);
    if (type == "default") {
      out.push_back(inv);
    } else if (type == "linear") {
      out.push_back(inv / factor);
    } else {  // llama3
      const double wavelen = 2.0 * M_PI / inv;
      if (wavelen < ocl / high) {
        out.push_back(inv);
      } else if (wavelen > ocl / low) {
        out.push_back(inv / factor);
      } else {
        const double smooth = (ocl / wavelen - low) / (high - low);
        out.push_back((1.0 - smooth) * inv / factor + smooth * inv);
      }
    }
  }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * std::fabs(want[i])) << "index " << i;
  }
}

TEST(ModelConfigRope, DefaultAndLinearInvFreqMatchFormula) {
  RopeConfig r;
  r.theta = 10000.0f;
  std::vector<float> inv = rope_inv_freq(r, 16);
  ASSERT_EQ(inv.size(), 8u);
  EXPECT_EQ(inv[0], 1.0f);
  expect_close(inv, reference_inv_freq(10000.0, 16, "default"), 2e-6);

  r.type = "linear";
  r.factor = 4.0f;
  expect_close(rope_inv_freq(r, 16), reference_inv_freq(10000.0, 16, "linear", 4.0), 2e-6);
}

TEST(ModelConfigRope, Llama3InvFreqMatchesFormulaInAllThreeBands) {
  // Llama 3.1 8B: theta 500000, head_dim 128, factor 8, low 1, high 4, 8192.
  ModelConfig c = parse_model_config(R"({"model_type": "llama", "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}})");
  std::vector<float> inv = rope_inv_freq(c.rope, 128);
  std::vector<double> want = reference_inv_freq(500000.0, 128, "llama3", 8.0, 1.0, 4.0, 8192.0);
  expect_close(inv, want, 5e-6);

  // The case must exercise the unscaled, smoothed and fully scaled bands.
  int high = 0, medium = 0, low = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double unscaled = 1.0 / std::pow(500000.0, 2.0 * i / 128.0);
    const double wavelen = 2.0 * M_PI / unscaled;
    if (wavelen < 2048.0) {
      ++high;
      EXPECT_EQ(inv[i], rope_inv_freq(RopeConfig{500000.0f}, 128)[i]);  // untouched
    } else if (wavelen > 8192.0) {
      ++low;
    } else {
      ++medium;
    }
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(medium, 0);
  EXPECT_GT(low, 0);
}

TEST(ModelConfigRope, RejectsOddHeadDim) {
  EXPECT_THROW(rope_inv_freq(RopeConfig{}, 7), Error);
  RopeConfig bad;
  bad.type = "yarn";
  EXPECT_THROW(rope_inv_freq(bad, 8), Error);
}

// The inverse frequencies transformers computed for the fixture checkpoints
// (tools/make_fixtures.py stores its rotary buffers in reference.json): ours
// must agree to float32 rounding. Skips when the fixtures are not made yet.
TEST(ModelConfigFixtures, RopeInvFreqMatchesTransformersBuffers) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(KVGRAPH_SOURCE_DIR) / "tests" / "fixtures" / "models";
  int checked = 0;
  std::error_code ec;
  if (fs::is_directory(root, ec)) {
    for (const auto& entry : fs::directory_iterator(root)) {
      std::ifstream in(entry.path() / "reference.json");
      if (!in || !fs::exists(entry.path() / "config.json")) continue;
      const nlohmann::json ref = nlohmann::json::parse(in);
      if (!ref.contains("rope_inv_freq")) continue;
      const ModelConfig c = load_model_config(entry.path());
      for (const auto& [buffer, values] : ref["rope_inv_freq"].items()) {
        const bool local = buffer.find("sliding_attention") != std::string::npos;
        const std::vector<float> want = values.get<std::vector<float>>();
        const std::vector<float> got = rope_inv_freq(local ? c.rope_local : c.rope, c.head_dim);
        ASSERT_EQ(got.size(), want.size()) << entry.path().filename() << " " << buffer;
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_NEAR(got[i], want[i], 1e-6 * std::fabs(want[i]))
              << entry.path().filename() << " " << buffer << " index " << i;
        }
        ++checked;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "no fixtures with rope_inv_freq under " << root << " (tools/make_fixtures.py)";
}

}  // namespace
}  // namespace kvgraph
