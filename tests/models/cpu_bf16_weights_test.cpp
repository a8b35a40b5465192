// A bf16 checkpoint kept in bf16 in CPU memory (Model::CpuWeights::bf16:
// half the bytes of f32) computes what the same values widened to f32
// compute: the bf16 products widen a panel of rows at a time, which is exact.
#include <cstring>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/dtype.h"
#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "support/files.h"
#include "support/fixtures.h"
#include "support/logits.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The fixture `family` (stored in f32) with every tensor rounded to bf16,
// written as BF16 (bf16 = true) or as the rounded values in F32.
void write_rounded(const std::string& family, const fs::path& dir, bool bf16) {
  const fs::path src = fixtures_dir() / family;
  json cfg = json::parse(read_file(src / "config.json"));
  cfg.erase("torch_dtype");
  cfg["dtype"] = bf16 ? "bfloat16" : "float32";
  std::ofstream(dir / "config.json") << cfg.dump(2);

  const SafetensorsParts src_file = read_safetensors(src / "model.safetensors");
  const json& header = src_file.header;
  const char* data = src_file.data.data();
  // Tensors in data order, so the output stays contiguous.
  std::vector<std::pair<uint64_t, std::string>> order;
  for (auto it = header.begin(); it != header.end(); ++it)
    if (it.key() != "__metadata__") order.emplace_back(it.value()["data_offsets"][0].get<uint64_t>(), it.key());
  std::sort(order.begin(), order.end());
  json out = json::object();
  std::string body;
  for (const auto& [begin, name] : order) {
    const json& t = header[name];
    ASSERT_EQ(t["dtype"], "F32") << name;
    const uint64_t count = (t["data_offsets"][1].get<uint64_t>() - begin) / 4;
    const size_t at = body.size();
    for (uint64_t i = 0; i < count; ++i) {
      float f;
      std::memcpy(&f, data + begin + 4 * i, 4);
      const uint16_t h = f32_to_bf16(f);
      if (bf16) {
        body.append(reinterpret_cast<const char*>(&h), 2);
      } else {
        const float r = bf16_to_f32(h);
        body.append(reinterpret_cast<const char*>(&r), 4);
      }
    }
    out[name] = {{"dtype", bf16 ? "BF16" : "F32"}, {"shape", t["shape"]}, {"data_offsets", {at, body.size()}}};
  }
  write_bytes(dir / "model.safetensors", safetensors_bytes(out.dump(), body));
}

class CpuBf16Weights : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuBf16Weights, StayBf16AndMatchTheSameValuesInF32) {
  TempDir a_dir;
  const fs::path bf16_dir = a_dir.path() / "bf16", f32_dir = a_dir.path() / "f32";
  fs::create_directories(bf16_dir);
  fs::create_directories(f32_dir);
  write_rounded(GetParam(), bf16_dir, true);
  write_rounded(GetParam(), f32_dir, false);
  auto a = Model::load(bf16_dir, Device::CPU, {}, Model::CpuWeights::bf16);
  auto b = Model::load(f32_dir, Device::CPU, {}, Model::CpuWeights::bf16);  // stored f32: stays f32
  EXPECT_EQ(a->matrix_dtype(), DType::BF16);
  EXPECT_EQ(b->matrix_dtype(), DType::F32);
  // A small model keeps f32 unless asked (products from cache beat half the bytes).
  EXPECT_EQ(Model::load(bf16_dir, Device::CPU)->matrix_dtype(), DType::F32);
  EXPECT_EQ(Model::load(bf16_dir, Device::CPU, {}, Model::CpuWeights::f32)->matrix_dtype(), DType::F32);
  EXPECT_LT(a->weight_bytes(), b->weight_bytes() * 0.6);  // norms stay f32

  const Reference ref = load_reference(GetParam());
  for (int chunk : {1, static_cast<int>(ref.ids.size())}) {
    const std::vector<float> la = prefill_logits(a, ref.ids, {.max_write = chunk}),
                             lb = prefill_logits(b, ref.ids, {.max_write = chunk});
    ASSERT_EQ(la.size(), lb.size());
    double worst = 0;
    for (size_t i = 0; i < la.size(); ++i) worst = std::max(worst, double(std::abs(la[i] - lb[i])));
    EXPECT_LT(worst, 1e-5) << GetParam() << " chunk " << chunk;
  }
}

// Families with biases (qwen2), tied and untied heads, sandwich norms (gemma3).
INSTANTIATE_TEST_SUITE_P(Families, CpuBf16Weights, ::testing::Values("llama", "qwen2", "gemma3"),
                         [](const auto& info) { return info.param; });

}  // namespace
