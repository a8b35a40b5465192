// The family schema (src/models/family.h) is the one list of checkpoint
// tensors that the config parser, the loader and the synthetic checkpoints
// read: every family has an entry, the loader accepts a checkpoint holding
// exactly the schema's tensors, and refuses one missing any of them, naming it.
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "models/family.h"
#include "support/files.h"
#include "support/load_error.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const Family kAllFamilies[] = {Family::Llama, Family::Qwen2, Family::Mistral,
                               Family::Gemma2, Family::Gemma3, Family::Qwen3};

// A two-layer config of the family, small enough to write in a test.
// all_options: every bias the family can read switched on, and an untied lm_head.
json small_config(const FamilySchema& fs, bool all_options) {
  return {{"model_type", fs.model_types.front()},
          {"vocab_size", 16},
          {"hidden_size", 8},
          {"intermediate_size", 12},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"head_dim", 4},
          {"max_position_embeddings", 64},
          {"torch_dtype", "float32"},
          {"attention_bias", all_options},
          {"mlp_bias", all_options},
          {"tie_word_embeddings", !all_options}};
}

// Every part of every plan, with f32 values, except the tensor named `skip`.
void write_checkpoint(const fs::path& dir, const json& config, const std::vector<TensorPlan>& plans,
                      const std::string& skip = {}) {
  std::ofstream(dir / "config.json") << config.dump(2);
  json header = json::object();
  std::string data;
  for (const TensorPlan& plan : plans) {
    for (const TensorPlan::Part& p : plan.parts) {
      if (p.name == skip) continue;
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      const size_t begin = data.size();
      for (int64_t i = 0; i < n; ++i) {
        const float v = 0.01f * static_cast<float>((i % 7) - 3);
        data.append(reinterpret_cast<const char*>(&v), sizeof v);
      }
      header[p.name] = {{"dtype", "F32"}, {"shape", p.shape}, {"data_offsets", {begin, data.size()}}};
    }
  }
  write_bytes(dir / "model.safetensors", safetensors_bytes(header.dump(), data));
}

// Bytes of the Model tensors the plans make, on the CPU in f32.
size_t plan_bytes(const std::vector<TensorPlan>& plans) {
  size_t bytes = 0;
  for (const TensorPlan& plan : plans) {
    size_t n = sizeof(float);
    for (int64_t d : plan.shape()) n *= size_t(d);
    bytes += n;
  }
  return bytes;
}

}  // namespace

TEST(FamilySchema, EveryFamilyHasAnEntryReachedFromItsModelTypes) {
  for (Family f : kAllFamilies) {
    const FamilySchema& fs = family_schema(f);
    EXPECT_EQ(fs.family, f);
    EXPECT_EQ(family_name(f), fs.name);
    ASSERT_FALSE(fs.model_types.empty()) << fs.name;
    for (std::string_view t : fs.model_types) {
      EXPECT_EQ(find_family(t), &fs) << t;
      EXPECT_EQ(parse_model_config(json{{"model_type", t}}.dump()).family, f) << t;
      EXPECT_THAT(supported_model_types(), ::testing::HasSubstr(std::string(t)));
    }
  }
  EXPECT_EQ(find_family("bert"), nullptr);
}

TEST(FamilySchema, PlansFollowTheConfigSwitches) {
  // Llama with biases and an untied head: every optional tensor but the Gemma / Qwen3 norms.
  const json llama = small_config(family_schema(Family::Llama), /*all_options=*/true);
  const ModelConfig c = parse_model_config(llama.dump());
  std::vector<std::string> names;
  for (const TensorPlan& p : plan_weights(c, {}))
    for (const TensorPlan::Part& part : p.parts) names.push_back(part.name);
  EXPECT_THAT(names, ::testing::Contains("lm_head.weight"));
  EXPECT_THAT(names, ::testing::Contains("model.layers.1.self_attn.o_proj.bias"));
  EXPECT_THAT(names, ::testing::Contains("model.layers.1.mlp.down_proj.bias"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("model.layers.0.self_attn.q_norm.weight")));
  // gate and up interleave into one [2F, D] tensor; q, k, v stack into [(Hq + 2 Hkv) hd, D].
  for (const TensorPlan& p : plan_weights(c, {})) {
    if (p.parts.front().name == "model.layers.0.mlp.gate_proj.weight") {
      EXPECT_EQ(p.fuse, Fuse::interleave);
      EXPECT_EQ(p.shape(), (std::vector<int64_t>{24, 8}));
    }
    if (p.parts.front().name == "model.layers.0.self_attn.q_proj.weight") {
      EXPECT_EQ(p.fuse, Fuse::stack);
      EXPECT_EQ(p.shape(), (std::vector<int64_t>{16, 8}));
    }
  }
}

class FamilyCheckpoint : public ::testing::TestWithParam<std::tuple<Family, bool>> {};

TEST_P(FamilyCheckpoint, LoaderAcceptsExactlyTheSchemaTensorsAndNamesEachMissingOne) {
  const auto [family, all_options] = GetParam();
  const json config = small_config(family_schema(family), all_options);
  const std::vector<TensorPlan> plans = plan_weights(parse_model_config(config.dump()), {});
  TempDir dir;

  write_checkpoint(dir.path(), config, plans);
  std::shared_ptr<Model> m;
  ASSERT_NO_THROW(m = Model::load(dir.path(), Device::CPU));
  EXPECT_EQ(m->weight_bytes(), plan_bytes(plans));  // made exactly the planned tensors

  for (const TensorPlan& plan : plans) {
    for (const TensorPlan::Part& p : plan.parts) {
      write_checkpoint(dir.path(), config, plans, /*skip=*/p.name);
      EXPECT_THAT(load_error(dir.path()), ::testing::HasSubstr("[weights] missing tensor \"" + p.name + "\""));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, FamilyCheckpoint,
                         ::testing::Combine(::testing::ValuesIn(kAllFamilies), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(family_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_AllOptions" : "_Plain");
                         });

TEST(FamilySchema, MultimodalPrefixesNameTheSameTensors) {
  json config = {{"model_type", "gemma3"},
                 {"text_config", small_config(family_schema(Family::Gemma3), /*all_options=*/true)}};
  config["text_config"].erase("model_type");
  const ModelConfig c = parse_model_config(config.dump());
  for (const CheckpointNames& names : {CheckpointNames{"language_model.model.", "language_model."},
                                       CheckpointNames{"model.language_model.", ""}}) {
    TempDir dir;
    const std::vector<TensorPlan> plans = plan_weights(c, names);
    write_checkpoint(dir.path(), config, plans);
    std::shared_ptr<Model> m;
    ASSERT_NO_THROW(m = Model::load(dir.path(), Device::CPU)) << names.decoder;
    EXPECT_EQ(m->weight_bytes(), plan_bytes(plans)) << names.decoder;
    write_checkpoint(dir.path(), config, plans, /*skip=*/names.top + "lm_head.weight");
    EXPECT_THAT(load_error(dir.path()), ::testing::HasSubstr("missing tensor \"" + names.top + "lm_head.weight\""));
  }
}
