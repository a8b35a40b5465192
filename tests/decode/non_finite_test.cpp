// One NaN in one weight must stop decoding with one clear error, never emit
// tokens (or scores) computed from NaN.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/ops.h"
#include "kvgraph/session.h"
#include "support/fixtures.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;

namespace {

// The llama fixture with element `index` of f32 tensor `name` set to `value`.
std::filesystem::path poisoned(const TempDir& dir, const std::string& name, int index, float value) {
  const auto src = fixtures_dir() / "llama";
  std::filesystem::copy_file(src / "config.json", dir.path() / "config.json");
  std::ifstream in(src / "model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header.at(name).at("dtype"), "F32");
  const size_t at = 8 + n + header.at(name).at("data_offsets")[0].get<size_t>() + 4 * size_t(index);
  std::memcpy(bytes.data() + at, &value, 4);
  std::ofstream(dir.path() / "model.safetensors", std::ios::binary) << bytes;
  return dir.path();
}

}  // namespace

TEST(NonFiniteLogits, DecodingStopsWithOneClearError) {
  TempDir dir;
  auto m = Model::load(poisoned(dir, "model.norm.weight", 3, std::numeric_limits<float>::quiet_NaN()),
                       Device::CPU);
  for (bool eager : {false, true}) {
    Session s(m, {.capacity = 32, .eager = eager});
    const std::vector<int32_t> prompt{1, 2, 3};
    s.prefill(prompt);
    try {
      s.sample();
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("[model] non-finite logits at position 3"));
    }
  }
}

TEST(NonFiniteLogits, ScoringStopsAtTheFirstBadRow) {
  TempDir dir;
  auto m = Model::load(poisoned(dir, "model.norm.weight", 0, std::numeric_limits<float>::infinity()), Device::CPU);
  Session s(m, {.capacity = 32, .all_logits = true});
  const std::vector<int32_t> ids{1, 2, 3, 4};
  int chunks = 0;
  try {
    s.prefill(ids, [&](int32_t, int32_t, const std::vector<float>&) { ++chunks; });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("non-finite logits at position 0"));
  }
  EXPECT_EQ(chunks, 0);
}

TEST(NonFiniteLogits, TheSampleOpReportsMinusOneAndMarksNothing) {
  Stream s(Device::CPU);
  std::vector<float> l{0.5f, 2.f, std::numeric_limits<float>::quiet_NaN(), 1.f};
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    l[2] = bad;
    for (float temperature : {0.f, 0.7f}) {
      Tensor logits = Tensor::from_host(l.data(), {4}, DType::F32, Device::CPU);
      ops::SamplingParams p{.temperature = temperature, .seed = 5};
      Tensor cfg = Tensor::from_host(&p, {int64_t(sizeof p)}, DType::U8, Device::CPU);
      Tensor banned = Tensor::zeros({1}, DType::I32, Device::CPU), seen = Tensor::zeros({4}, DType::U8, Device::CPU);
      Tensor pos = Tensor::zeros({1}, DType::I32, Device::CPU), tok = Tensor::zeros({1}, DType::I32, Device::CPU);
      ops::sample(s, logits, cfg, banned, 0, seen, pos, tok);
      EXPECT_EQ(s.read_i32(tok), -1);
      for (float x : seen.to_f32_vector()) EXPECT_EQ(x, 0.f);
    }
  }
  // A banned NaN is masked before the check, as on the device.
  l[2] = std::numeric_limits<float>::quiet_NaN();
  Tensor logits = Tensor::from_host(l.data(), {4}, DType::F32, Device::CPU);
  ops::SamplingParams p;
  Tensor cfg = Tensor::from_host(&p, {int64_t(sizeof p)}, DType::U8, Device::CPU);
  const int32_t two = 2;
  Tensor banned = Tensor::from_host(&two, {1}, DType::I32, Device::CPU), seen = Tensor::zeros({4}, DType::U8, Device::CPU);
  Tensor pos = Tensor::zeros({1}, DType::I32, Device::CPU), tok = Tensor::zeros({1}, DType::I32, Device::CPU);
  ops::sample(s, logits, cfg, banned, 1, seen, pos, tok);
  EXPECT_EQ(s.read_i32(tok), 1);
}
