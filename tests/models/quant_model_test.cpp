// Affine-quantized weights (MLX layout, issue 13) on the CPU: the quantizer
// and packing against an independent reference bit for bit; quantized ops
// against the plain ops on the dequantised matrix; MLX-layout checkpoints
// against the same values loaded as a plain f32 checkpoint; quantize-on-load
// against the MLX layout; compiled == eager; and every malformed checkpoint
// failing with one error naming the tensor.
#include <cmath>
#include <cstring>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/ops.h"
#include "kvgraph/quant.h"
#include "kvgraph/session.h"
#include "support/decode_trace.h"
#include "support/fixtures.h"
#include "support/load_error.h"
#include "support/mlx_checkpoint.h"
#include "support/temp_dir.h"
#include "support/logits.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

// Random rows with the groups quantization finds hard: constant, all zero,
// all negative, all positive, and exact ties at half a step.
std::vector<float> test_matrix(int64_t N, int64_t K, int group, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<float> w(N * K);
  for (float& v : w) v = nd(rng);
  auto fill_group = [&](int64_t row, int64_t g, auto f) {
    for (int j = 0; j < group; ++j) w[row * K + g * group + j] = f(j);
  };
  fill_group(0, 0, [](int) { return 0.0f; });
  if (N > 1) fill_group(1, 0, [](int) { return 0.25f; });
  if (N > 2) fill_group(2, 0, [&](int j) { return -std::fabs(nd(rng)) - 0.01f; });
  if (N > 3) fill_group(3, 0, [&](int j) { return std::fabs(nd(rng)) + 0.01f; });
  if (N > 4) fill_group(4, 0, [](int j) { return 0.5f * (j % 16) - 4.0f; });  // steps of 0.5 (halves for 4 bits)
  return w;
}

}  // namespace

// ----------------------------------------------------------------- format

TEST(QuantFormat, QuantizeAndPackMatchAnIndependentReferenceBitForBit) {
  for (int bits : {4, 8})
    for (int group : {32, 64, 128}) {
      SCOPED_TRACE(::testing::Message() << "bits " << bits << " group " << group);
      const int64_t N = 9, K = 256;
      const std::vector<float> w = test_matrix(N, K, group, 3 + bits + group);
      std::vector<uint32_t> words(N * K * bits / 32);
      std::vector<float> scales(N * K / group), biases(scales.size());
      affine_quantize(w.data(), N, K, bits, group, words.data(), scales.data(), biases.data());
      // The words, unpacked byte by byte from their stored (little-endian) bytes.
      const std::string bytes(reinterpret_cast<const char*>(words.data()), words.size() * 4);
      const std::vector<uint32_t> codes = reference_unpack(bytes, N * K, bits);
      for (int64_t r = 0; r < N; ++r) {
        std::vector<uint32_t> row_codes;
        for (int64_t g = 0; g < K / group; ++g) {
          const Group ref = reference_group(w.data() + r * K + g * group, group, bits);
          const int64_t gi = r * (K / group) + g;
          ASSERT_EQ(std::memcmp(&ref.scale, &scales[gi], 4), 0) << "scale of row " << r << " group " << g;
          ASSERT_EQ(std::memcmp(&ref.bias, &biases[gi], 4), 0) << "bias of row " << r << " group " << g;
          row_codes.insert(row_codes.end(), ref.codes.begin(), ref.codes.end());
          for (int j = 0; j < group; ++j) {
            const int64_t k = g * group + j;
            ASSERT_EQ(codes[r * K + k], ref.codes[j]) << "row " << r << " k " << k;
            ASSERT_EQ(affine_code(words.data() + r * K * bits / 32, k, bits), ref.codes[j]);
            // Within a step of the value it stands for (MLX's own test's bound:
            // the grid is anchored at the edge, so the far end may be clamped).
            const float v = affine_value(scales[gi], codes[r * K + k], biases[gi]);
            EXPECT_LE(std::fabs(v - w[r * K + k]), std::fabs(scales[gi]) + 1e-6f);
          }
        }
        const std::vector<uint32_t> packed = reference_pack(row_codes, bits);
        ASSERT_EQ(std::memcmp(packed.data(), words.data() + r * K * bits / 32, packed.size() * 4), 0) << "row " << r;
      }
      // Edges: a zero group is all zero; the extreme of larger magnitude is exact.
      EXPECT_EQ(affine_value(scales[0], codes[0], biases[0]), 0.0f);
      EXPECT_EQ(affine_value(scales[K / group], codes[K], biases[K / group]), 0.25f);
      float lo = 0;
      for (int j = 0; j < group; ++j) lo = std::min(lo, w[2 * K + j]);
      EXPECT_EQ(affine_value(scales[2 * (K / group)], 0, biases[2 * (K / group)]), lo);
      affine_dequantize(words.data(), scales.data(), biases.data(), N, K, bits, group, std::vector<float>(N * K).data());
    }
}

// ----------------------------------------------------------------- ops

namespace {

// A quantized Weight from f32 rows, scales and biases stored in `ft`, and the
// f32 matrix it stands for.
struct QuantCase {
  Weight q;
  Tensor plain;
};
QuantCase quantized_weight(int64_t N, int64_t K, int bits, int group, DType ft, uint32_t seed) {
  const std::vector<float> w = test_matrix(N, K, group, seed);
  std::vector<uint32_t> words(N * K * bits / 32);
  std::vector<float> s(N * K / group), b(s.size());
  affine_quantize(w.data(), N, K, bits, group, words.data(), s.data(), b.data());
  if (ft == DType::BF16)
    for (auto* v : {&s, &b})
      for (float& x : *v) x = bf16_to_f32(f32_to_bf16(x));
  std::vector<float> dense(N * K);
  affine_dequantize(words.data(), s.data(), b.data(), N, K, bits, group, dense.data());
  auto in_ft = [&](const std::vector<float>& v, std::vector<int64_t> shape) {
    if (ft == DType::F32) return Tensor::from_host(v.data(), shape, DType::F32, Device::CPU);
    std::vector<uint16_t> h;
    for (float x : v) h.push_back(f32_to_bf16(x));
    return Tensor::from_host(h.data(), shape, DType::BF16, Device::CPU);
  };
  QuantCase c;
  c.q.w = Tensor::from_host(words.data(), {N, K * bits / 32}, DType::U32, Device::CPU);
  c.q.scales = in_ft(s, {N, K / group});
  c.q.biases = in_ft(b, {N, K / group});
  c.q.format = {bits, group};
  c.plain = Tensor::from_host(dense.data(), {N, K}, DType::F32, Device::CPU);
  return c;
}

Tensor random_f32(std::vector<int64_t> shape, uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return Tensor::from_host(v.data(), shape, DType::F32, Device::CPU);
}

}  // namespace

TEST(QuantOps, LinearAndEmbeddingEqualThePlainOpsOnTheDequantisedMatrix) {
  Stream s(Device::CPU);
  for (DType ft : {DType::F32, DType::BF16})
    for (int bits : {4, 8})
      for (int T : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(ft) << " bits " << bits << " T " << T);
        const int64_t N = 96, K = 128;
        QuantCase c = quantized_weight(N, K, bits, 32, ft, 17 + bits);
        Tensor x = random_f32({T, K}, 5), norm = random_f32({K}, 6), res = random_f32({T, N}, 7);
        Tensor bias_f32 = random_f32({N}, 8);
        std::vector<float> bh = bias_f32.to_f32_vector();
        std::vector<uint16_t> b16;
        for (float& v : bh) v = bf16_to_f32(f32_to_bf16(v)), b16.push_back(f32_to_bf16(v));
        Tensor bias_q = ft == DType::F32 ? Tensor::from_host(bh.data(), {N}, DType::F32, Device::CPU)
                                         : Tensor::from_host(b16.data(), {N}, DType::BF16, Device::CPU);
        Tensor bias_p = Tensor::from_host(bh.data(), {N}, DType::F32, Device::CPU);
        for (int epi = 0; epi < 3; ++epi) {
          ops::LinearOptions oq, op;
          oq.norm = op.norm = &norm;
          oq.bias = &bias_q;
          op.bias = &bias_p;
          oq.gated = op.gated = epi == 1;
          if (epi == 2) oq.residual = op.residual = &res;
          const int64_t n_out = epi == 1 ? N / 2 : N;
          Tensor yq = Tensor::zeros({T, n_out}, DType::F32, Device::CPU), yp = yq.reshape({T, n_out});
          yp = Tensor::zeros({T, n_out}, DType::F32, Device::CPU);
          ops::linear(s, x, c.q, yq, oq);
          ops::linear(s, x, c.plain, yp, op);
          EXPECT_LT(normalized_error(yq.to_f32_vector(), yp.to_f32_vector()), 1e-6) << "epilogue " << epi;
        }
        // Embedding rows: dequantised exactly, then scaled.
        const std::vector<int32_t> ids = {5, 0, 95};
        Tensor id = Tensor::from_host(ids.data(), {3}, DType::I32, Device::CPU);
        Tensor eq = Tensor::zeros({3, K}, DType::F32, Device::CPU), ep = Tensor::zeros({3, K}, DType::F32, Device::CPU);
        ops::embedding(s, c.q, id, eq, 1.5f);
        ops::embedding(s, c.plain, id, ep, 1.5f);
        const auto a = eq.to_f32_vector(), b = ep.to_f32_vector();
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
      }
}

TEST(QuantOps, FrontRejectsInconsistentWeights) {
  Stream s(Device::CPU);
  QuantCase c = quantized_weight(8, 64, 4, 32, DType::F32, 1);
  Tensor x = random_f32({1, 64}, 2), y = Tensor::zeros({1, 8}, DType::F32, Device::CPU);
  ops::LinearOptions o;
  auto expect_fail = [&](Weight w, const char* what) {
    try {
      ops::linear(s, x, w, y, o);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
  };
  Weight w = c.q;
  w.scales = c.q.scales.reshape({4, 4});
  expect_fail(w, "scales and biases must be [8, 2]");
  w = c.q;
  w.biases = Tensor();
  expect_fail(w, "without scales or biases");
  w = c.q;
  w.format = {3, 32};
  expect_fail(w, "3 bits in groups of 32");
  w = c.q;
  w.format = {4, 128};  // K = 64
  expect_fail(w, "not a multiple of the group size 128");
  w = c.q;
  Tensor bias = Tensor::zeros({8}, DType::BF16, Device::CPU);
  o.bias = &bias;
  expect_fail(w, "bias dtype bf16 differs");
}

// ----------------------------------------------------------------- models

class QuantModel : public ::testing::TestWithParam<std::string> {};

// The MLX-layout checkpoint and the plain f32 checkpoint of the values it
// stands for give the same logits; quantizing the f32 fixture on load gives
// the MLX-layout checkpoint's logits bit for bit.
TEST_P(QuantModel, MlxCheckpointMatchesItsDequantisedValuesAndQuantizeOnLoad) {
  const Reference ref = load_reference(GetParam());
  const fs::path src = fixtures_dir() / GetParam();
  TempDir tmp;
  struct Case {
    int bits, group;
    bool bf16_scales;
  };
  for (Case k : {Case{4, 32, false}, Case{8, 64, false}, Case{4, 64, true}}) {
    SCOPED_TRACE(::testing::Message() << GetParam() << " int" << k.bits << " g" << k.group
                                    << (k.bf16_scales ? " bf16 scales" : ""));
    const MlxCheckpoint q = make_mlx(src, k.bits, k.group, k.bf16_scales);
    const fs::path qdir = tmp.path() / "q", ddir = tmp.path() / "dq";
    fs::remove_all(qdir);
    fs::remove_all(ddir);
    write_checkpoint(qdir, q);
    write_checkpoint(ddir, dequantised(q));
    auto qm = Model::load(qdir, Device::CPU);
    ASSERT_EQ(qm->quantization(), (QuantFormat{k.bits, k.group}));
    auto dm = Model::load(ddir, Device::CPU);
    ASSERT_FALSE(dm->quantization().quantized());
    EXPECT_LT(qm->weight_bytes(), dm->weight_bytes() * (k.bits == 4 ? 0.3 : 0.4));
    const std::vector<float> ql = prefill_logits(qm, ref.ids, {.max_write = 7}),
                             dl = prefill_logits(dm, ref.ids, {.max_write = 7});
    EXPECT_LT(normalized_error(ql, dl), 1e-3);
    EXPECT_LT(normalized_error(ql, dl), 1e-5) << "expected only summation-order differences";
    // Quantization changes the model: not the fixture's own logits, but near them.
    const double drift = normalized_error(ql, ref.logits);
    EXPECT_GT(drift, 1e-6);
    EXPECT_LT(drift, k.bits == 8 ? 0.15 : 1.0);  // random fixture weights: the worst case for a grid
    if (!k.bf16_scales) {
      auto on_load = Model::load(src, Device::CPU, {}, Model::CpuWeights::automatic, {k.bits, k.group});
      ASSERT_EQ(on_load->quantization(), (QuantFormat{k.bits, k.group}));
      EXPECT_EQ(on_load->weight_bytes(), qm->weight_bytes());
      const std::vector<float> ol = prefill_logits(on_load, ref.ids, {.max_write = 7});
      ASSERT_EQ(ol.size(), ql.size());
      EXPECT_EQ(std::memcmp(ol.data(), ql.data(), ol.size() * 4), 0) << "quantize on load vs MLX layout";
    }
  }
}

// mlx-lm leaves a layer whose input dim is not a multiple of the group in
// float; so does quantize on load (the fixtures' K is 64 except down_proj's 128).
TEST_P(QuantModel, QuantizeOnLoadLeavesMatricesTheGroupDoesNotDivideFloat) {
  const fs::path src = fixtures_dir() / GetParam();
  auto m = Model::load(src, Device::CPU, {}, Model::CpuWeights::automatic, {4, 128});
  auto plain = Model::load(src, Device::CPU);
  EXPECT_EQ(m->quantization(), (QuantFormat{4, 128}));
  EXPECT_LT(m->weight_bytes(), plain->weight_bytes());
  const ModelInfo info = Model::describe(src, Device::CPU, Model::CpuWeights::automatic, {4, 128});
  EXPECT_EQ(info.weight_bytes, m->weight_bytes());
  EXPECT_FALSE(info.quantized_checkpoint);
  const Reference ref = load_reference(GetParam());
  const std::vector<float> l = prefill_logits(m, ref.ids, {.max_write = 16});
  EXPECT_LT(normalized_error(l, ref.logits), 0.5);
}

INSTANTIATE_TEST_SUITE_P(Families, QuantModel, ::testing::Values("llama", "qwen2", "gemma3"),
                         [](const auto& info) { return info.param; });

// ----------------------------------------------------------------- compiled

TEST(QuantCompiledDecode, BitwiseEqualToEager) {
  TempDir tmp;
  write_checkpoint(tmp.path() / "mlx", make_mlx(fixtures_dir() / "gemma3", 8, 32, true));
  struct Case {
    std::string what;
    std::shared_ptr<Model> model;
    std::string family;
  };
  std::vector<Case> cases = {
      {"gemma3 int4/g32 on load",
       Model::load(fixtures_dir() / "gemma3", Device::CPU, {}, Model::CpuWeights::automatic, {4, 32}), "gemma3"},
      {"qwen2 int8/g64 on load",
       Model::load(fixtures_dir() / "qwen2", Device::CPU, {}, Model::CpuWeights::automatic, {8, 64}), "qwen2"},
      {"gemma3 MLX int8/g32 bf16 scales", Model::load(tmp.path() / "mlx", Device::CPU), "gemma3"},
  };
  for (const Case& c : cases) {
    const Reference ref = load_reference(c.family);
    const ops::SamplingParams sp{0.9f, 20, 0.9f, 1.1f, 7};
    const Trace e = decode_trace(c.model, {.capacity = 120, .max_write = 4, .eager = true}, ref.greedy_prompt, 100, sp);
    const Trace r = decode_trace(c.model, {.capacity = 120, .max_write = 4}, ref.greedy_prompt, 100, sp);
    expect_bitwise(e, r, c.what);
  }
}

// ----------------------------------------------------------------- bad input

TEST(QuantCheckpoint, MalformedCheckpointsFailWithOneErrorNamingTheTensor) {
  TempDir tmp;
  const MlxCheckpoint good = make_mlx(fixtures_dir() / "llama", 4, 32);
  const std::string o = "model.layers.0.self_attn.o_proj";
  {  // a group that does not divide the input dim
    MlxCheckpoint m = good;
    m.config["quantization"]["group_size"] = 128;
    EXPECT_THAT(load_error(tmp, m), HasSubstr("input dim 64 is not a multiple of the quantization group size 128"));
    EXPECT_THAT(load_error(tmp, m), HasSubstr("\"model.embed_tokens.weight\""));
  }
  {  // bits that do not match the packed words
    MlxCheckpoint m = good;
    m.config["quantization"]["bits"] = 8;
    EXPECT_THAT(load_error(tmp, m), HasSubstr("\"model.embed_tokens.weight\": expected shape [256, 16], found [256, 8]"));
  }
  {  // group size that does not match the scales
    MlxCheckpoint m = good;
    m.config["quantization"]["group_size"] = 64;
    EXPECT_THAT(load_error(tmp, m), HasSubstr("\"model.embed_tokens.scales\": expected shape [256, 1], found [256, 2]"));
  }
  {  // missing biases
    MlxCheckpoint m = good;
    m.tensors.erase(o + ".biases");
    EXPECT_THAT(load_error(tmp, m), HasSubstr("missing tensor \"" + o + ".biases\""));
  }
  {  // missing scales: packed words without them
    MlxCheckpoint m = good;
    m.tensors.erase(o + ".scales");
    EXPECT_THAT(load_error(tmp, m), HasSubstr("\"" + o + ".weight\" is packed (u32) but \"" + o + ".scales\" is missing"));
  }
  {  // one part of a fused matrix quantized, another not (k_proj in f32)
    MlxCheckpoint m = good;
    const std::string k = "model.layers.1.self_attn.k_proj";
    m.tensors[k + ".weight"] = read_checkpoint(fixtures_dir() / "llama" / "model.safetensors").at(k + ".weight");
    m.tensors.erase(k + ".scales");
    m.tensors.erase(k + ".biases");
    EXPECT_THAT(load_error(tmp, m), HasSubstr("are fused into one matrix, but only one of them is quantized"));
  }
  {  // scales of the wrong shape
    MlxCheckpoint m = good;
    m.tensors[o + ".scales"].shape = {32, 4};
    EXPECT_THAT(load_error(tmp, m), HasSubstr("\"" + o + ".scales\": expected shape [64, 2], found [32, 4]"));
  }
  {  // scales that are not a float type
    MlxCheckpoint m = good;
    m.tensors[o + ".biases"].dtype = "I32";
    EXPECT_THAT(load_error(tmp, m), HasSubstr("\"" + o + ".biases\": dtype i32 is not a float type"));
  }
  {  // words that are not U32
    MlxCheckpoint m = good;
    m.tensors[o + ".weight"].dtype = "F32";
    EXPECT_THAT(load_error(tmp, m), HasSubstr("\"" + o + ".weight\": a quantized matrix must be packed in U32 words"));
  }
  {  // quantized tensors, but no "quantization" in config.json
    MlxCheckpoint m = good;
    m.config.erase("quantization");
    m.config.erase("quantization_config");
    EXPECT_THAT(load_error(tmp, m), HasSubstr("is quantized (\"model.embed_tokens.scales\" is present) but"));
  }
  {  // an unknown quantization mode, method or format
    MlxCheckpoint m = good;
    m.config["quantization"]["mode"] = "mxfp4";
    EXPECT_THAT(load_error(tmp, m), HasSubstr("\"quantization.mode\" \"mxfp4\" is not supported (supported: \"affine\")"));
    m = good;
    m.config.erase("quantization");
    m.config["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}};
    EXPECT_THAT(load_error(tmp, m), HasSubstr("quantization method \"gptq\" is not supported"));
    m = good;
    m.config["quantization"]["bits"] = 3;
    EXPECT_THAT(load_error(tmp, m), HasSubstr("3 bits in groups of 32 is not supported"));
    m = good;
    m.config["quantization"]["model.layers.0.mlp.down_proj"] = {{"bits", 8}, {"group_size", 32}};
    EXPECT_THAT(load_error(tmp, m), HasSubstr("per-layer settings (\"model.layers.0.mlp.down_proj\") are not supported"));
  }
  // Quantizing an already quantized checkpoint to another format.
  EXPECT_THAT(load_error(tmp, good, {8, 32}), HasSubstr("already quantized (int4, group 32); it cannot be loaded as int8"));
  EXPECT_EQ(load_error(tmp, good, {4, 32}), "");
  // And the good one loads; every message is one [component] line.
  EXPECT_EQ(load_error(tmp, good), "");
}
