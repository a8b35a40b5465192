// `kvgraph quantize` (quantize_checkpoint) and the safetensors writer under it:
// the written checkpoint against an independent MLX-layout writer
// (tests/support/mlx_checkpoint.h, written from MLX's source) byte for byte on
// every family fixture; loading it against quantize-on-load of the original,
// bit for bit; and every refusal leaving nothing behind.
#include <cstring>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/safetensors.h"
#include "kvgraph/session.h"
#include "support/errors.h"
#include "support/fixtures.h"
#include "support/logits.h"
#include "support/mlx_checkpoint.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

TEST(QuantizeCheckpoint, MatchesAnIndependentMlxWriterAndLoadsAsQuantizeOnLoad) {
  for (const std::string& fam : fixture_families()) {
    const fs::path src = fixtures_dir() / fam;
    for (auto [bits, group] : {std::pair{4, 32}, std::pair{8, 64}}) {
      SCOPED_TRACE(fam + " int" + std::to_string(bits) + " g" + std::to_string(group));
      TempDir tmp;
      const fs::path out = tmp.path() / "q";
      const QuantizeSummary s = quantize_checkpoint(src, out, {bits, group});
      EXPECT_GT(s.quantized, 0);
      EXPECT_LT(s.bytes_out, s.bytes_in);

      // Every tensor, byte for byte, as the independent writer makes it.
      const MlxCheckpoint want = make_mlx(src, bits, group);
      const Checkpoint got = read_checkpoint(out / "model.safetensors");
      ASSERT_EQ(got.size(), want.tensors.size());
      for (const auto& [name, e] : want.tensors) {
        SCOPED_TRACE(name);
        ASSERT_TRUE(got.count(name));
        EXPECT_EQ(got.at(name).dtype, e.dtype);
        EXPECT_EQ(got.at(name).shape, e.shape);
        EXPECT_TRUE(got.at(name).bytes == e.bytes);
      }
      const auto config = nlohmann::json::parse(read_file(out / "config.json"));
      EXPECT_EQ(config["quantization"], want.config["quantization"]);
      EXPECT_EQ(config["quantization_config"], want.config["quantization"]);
      EXPECT_TRUE(fs::exists(out / "tokenizer.json") == fs::exists(src / "tokenizer.json"));

      // inspect's view: every matrix in the format, the bytes summing to the total.
      const ModelInfo info = Model::describe(out, Device::CPU);
      size_t bytes = 0;
      int quantized = 0;
      for (const ModelInfo::Tensor& t : info.tensors) {
        bytes += t.bytes;
        quantized += t.format == "int" + std::to_string(bits) + "/g" + std::to_string(group);
        if (t.name.find("norm") != std::string::npos) EXPECT_EQ(t.format, "f32") << t.name;
      }
      EXPECT_EQ(bytes, info.weight_bytes);
      EXPECT_GT(quantized, 0);
      EXPECT_EQ(Model::load(out, Device::CPU)->weight_bytes(), info.weight_bytes);

      // Loading it is quantizing on load: the same logits, bit for bit.
      const std::vector<int32_t> ids = {1, 5, 9, 2, 7, 3};
      const auto a = prefill_logits(Model::load(out, Device::CPU), ids);
      const auto b = prefill_logits(Model::load(src, Device::CPU, {}, Model::CpuWeights::automatic, {bits, group}), ids);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    }
  }
}

TEST(QuantizeCheckpoint, RefusesWithOneMessageAndLeavesNothingBehind) {
  const fs::path src = fixtures_dir() / "llama";
  TempDir tmp;
  const fs::path q = tmp.path() / "q";
  quantize_checkpoint(src, q, {4, 64});
  EXPECT_THAT(error_of([&] { quantize_checkpoint(q, tmp.path() / "again", {4, 64}); }),
              HasSubstr("is already quantized (int4, group 64)"));
  EXPECT_THAT(error_of([&] { quantize_checkpoint(src, q, {8, 64}); }),
              HasSubstr("already exists and is not an empty directory"));
  EXPECT_THAT(error_of([&] { quantize_checkpoint(src, tmp.path() / "x", {3, 64}); }), HasSubstr("cannot quantize to 3 bits"));
  EXPECT_THAT(error_of([&] { quantize_checkpoint(tmp.path() / "nothing", tmp.path() / "x", {4, 64}); }),
              HasSubstr("does not exist"));
  // A checkpoint missing a tensor: refused before anything is written.
  const fs::path broken = tmp.path() / "broken";
  fs::create_directories(broken);
  fs::copy_file(src / "config.json", broken / "config.json");
  Checkpoint c = read_checkpoint(src / "model.safetensors");
  c.erase("model.layers.0.mlp.down_proj.weight");
  write_checkpoint(broken, {nlohmann::json::parse(read_file(src / "config.json")), c});
  EXPECT_THAT(error_of([&] { quantize_checkpoint(broken, tmp.path() / "x", {4, 64}); }),
              HasSubstr("model.layers.0.mlp.down_proj.weight"));
  EXPECT_FALSE(fs::exists(tmp.path() / "x"));
  EXPECT_FALSE(fs::exists(tmp.path() / "x.partial"));
  // An empty output directory is fine.
  fs::create_directories(tmp.path() / "empty");
  EXPECT_NO_THROW(quantize_checkpoint(src, tmp.path() / "empty", {8, 32}));
  EXPECT_TRUE(fs::exists(tmp.path() / "empty" / "model.safetensors"));
}

TEST(SafetensorsWriter, KeepsOrderAndMetadataAndReadsBack) {
  TempDir tmp;
  const fs::path f = tmp.path() / "t.safetensors";
  const std::vector<float> a = {1.5f, -2.f, 3.25f};
  const std::vector<uint32_t> b = {7u, 0xffffffffu};
  write_safetensors(f,
                    {{"z.first", DType::F32, {3}, [&](std::byte* o) { std::memcpy(o, a.data(), 12); }},
                     {"a.second", DType::U32, {1, 2}, [&](std::byte* o) { std::memcpy(o, b.data(), 8); }},
                     {"empty", DType::BF16, {0, 4}, [](std::byte*) {}}},
                    {{"format", "mlx"}});
  const SafetensorsParts p = read_safetensors(f);
  const std::string text = read_file(f);
  EXPECT_LT(text.find("\"z.first\""), text.find("\"a.second\""));
  EXPECT_EQ((text.size() - p.data.size()) % 8, 0u);
  SafetensorsFile file(f);
  EXPECT_EQ(file.metadata().at("format"), "mlx");
  EXPECT_EQ(to_f32(file.get("z.first")), a);
  const WeightView w = file.get("a.second");
  EXPECT_EQ(w.dtype, DType::U32);
  EXPECT_EQ(std::memcmp(w.data, b.data(), 8), 0);
  EXPECT_EQ(file.get("empty").numel(), 0);
  // A fill that throws leaves no file (and no temporary one).
  const fs::path g = tmp.path() / "g.safetensors";
  EXPECT_THROW(write_safetensors(g, {{"x", DType::F32, {1}, [](std::byte*) { throw std::runtime_error("boom"); }}}),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(g));
  EXPECT_FALSE(fs::exists(g.string() + ".tmp"));
  EXPECT_THAT(error_of([&] {
                write_safetensors(g, {{"x", DType::F32, {1}, [](std::byte*) {}}, {"x", DType::F32, {1}, [](std::byte*) {}}});
              }),
              HasSubstr("written twice"));
}
