// Gemma 3 multimodal checkpoints (Gemma3ForConditionalGeneration): the text
// decoder is loaded from under its multimodal names, the vision tower is left
// alone, and the logits are transformers' (the gemma3 fixture's reference,
// made by transformers for the same decoder weights).
#include <cmath>
#include <cstring>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "support/files.h"
#include "support/fixtures.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The gemma3 fixture rewritten as a multimodal checkpoint: config under
// "text_config", every tensor renamed from "model.*" to decoder_prefix + "*",
// plus one vision-tower tensor the loader must ignore. The data section is
// reused unchanged (the renamed header keeps every offset).
void write_multimodal(const fs::path& dir, const std::string& decoder_prefix, const std::string& vision_name,
                      bool keep_decoder = true) {
  const fs::path src = fixtures_dir() / "gemma3";
  json text = json::parse(read_file(src / "config.json"));
  json cfg = {{"model_type", "gemma3"},
              {"architectures", {"Gemma3ForConditionalGeneration"}},
              {"text_config", text},
              {"vision_config", {{"model_type", "siglip_vision_model"}, {"hidden_size", 8}}}};
  std::ofstream(dir / "config.json") << cfg.dump(2);

  const SafetensorsParts src_file = read_safetensors(src / "model.safetensors");
  const json& header = src_file.header;
  std::string data = keep_decoder ? src_file.data : std::string();
  json out = json::object();
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__" || !keep_decoder) continue;
    ASSERT_EQ(it.key().rfind("model.", 0), 0u) << it.key();
    out[decoder_prefix + it.key().substr(6)] = it.value();
  }
  const size_t off = data.size();  // the vision tensor goes after the decoder's data
  const float vision[4] = {1.f, 2.f, 3.f, 4.f};
  data.append(reinterpret_cast<const char*>(vision), sizeof(vision));
  out[vision_name] = {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {off, off + sizeof(vision)}}};
  write_bytes(dir / "model.safetensors", safetensors_bytes(out.dump(), data));
}

double worst_logit_error(const std::shared_ptr<Model>& model, const Reference& ref) {
  SessionOptions so;
  so.capacity = static_cast<int32_t>(ref.ids.size());
  so.max_write = 4;
  so.all_logits = true;
  Session s(model, so);
  double worst = 0;
  const int V = ref.vocab;
  s.prefill(ref.ids, [&](int32_t position, int32_t n, const std::vector<float>& logits) {
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < V; ++j)
        worst = std::max(worst, std::abs(double(logits[size_t(t) * V + j]) - ref.logits[size_t(position + t) * V + j]));
  });
  return worst;
}

struct Layout {
  const char* decoder_prefix;
  const char* vision_name;
};

class Gemma3Multimodal : public ::testing::TestWithParam<Layout> {};

TEST_P(Gemma3Multimodal, LoadsTheTextDecoderAndMatchesTransformers) {
  TempDir dir;
  write_multimodal(dir.path(), GetParam().decoder_prefix, GetParam().vision_name);
  const Reference ref = load_reference("gemma3");
  auto model = Model::load(dir.path(), Device::CPU);
  EXPECT_EQ(model->config().model_type, "gemma3");
  EXPECT_TRUE(model->config().nested_text_config);
  EXPECT_LT(worst_logit_error(model, ref), 1e-3) << GetParam().decoder_prefix;
}

INSTANTIATE_TEST_SUITE_P(Layouts, Gemma3Multimodal,
                         ::testing::Values(Layout{"language_model.model.", "vision_tower.vision_model.w"},
                                           Layout{"model.language_model.", "model.vision_tower.vision_model.w"}),
                         [](const auto& info) { return info.index == 0 ? "Published" : "SavedByTransformers5"; });

TEST(Gemma3MultimodalErrors, ACheckpointWithoutTheDecoderNamesTheMissingTensor) {
  TempDir dir;
  write_multimodal(dir.path(), "", "vision_tower.vision_model.w", /*keep_decoder=*/false);
  try {
    Model::load(dir.path(), Device::CPU);
    FAIL() << "loaded a checkpoint without decoder tensors";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("missing tensor \"model.embed_tokens.weight\""));
  }
}

}  // namespace
