// Safetensors reading: a hand-written round trip, a sharded index, and one
// malformed file per validation rule, each checked for its message.
#include "kvgraph/safetensors.h"


#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/error.h"

#include "support/errors.h"
#include "support/files.h"
#include "support/temp_dir.h"

namespace kvgraph {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;

using kvgraph::testing::TempDir;
using kvgraph::testing::error_of;
using kvgraph::testing::safetensors_bytes;
using kvgraph::testing::write_bytes;

template <typename T>
std::string raw(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// A valid file: tensors laid out back to back in the given order.
std::string build(const std::vector<TensorSpec>& tensors, const json& metadata = nullptr) {
  json h = json::object();
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  std::string data;
  for (const TensorSpec& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  return safetensors_bytes(h.dump(), data);
}

std::string open_error(const TempDir& dir, const std::string& bytes) {
  const fs::path p = dir.path() / "bad.safetensors";
  write_bytes(p, bytes);
  return error_of([&] { SafetensorsFile f(p); });
}

std::string f32_bytes(const std::vector<float>& v) { return raw(v); }

TEST(Safetensors, RoundTripConvertsF32Bf16F16) {
  TempDir dir;
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0e-3f, 1e20f, -0.0f, 7.0f};
  const std::vector<float> bf_vals = {1.0f, -2.5f, 0.15625f, 3.14159265f};
  std::vector<uint16_t> bf;
  for (float x : bf_vals) bf.push_back(f32_to_bf16(x));
  const std::vector<float> h_vals = {0.5f, -1.25f, 65504.0f, 6.103515625e-05f, 5.9604644775390625e-08f, 0.1f};
  std::vector<uint16_t> h;
  for (float x : h_vals) h.push_back(f32_to_f16(x));
  const std::vector<int32_t> i32 = {-7, 0, 123456};

  const fs::path p = dir.path() / "model.safetensors";
  write_bytes(p, build({{"a.f32", "F32", {2, 3}, raw(f32)},
                        {"b.bf16", "BF16", {4}, raw(bf)},
                        {"c.f16", "F16", {2, 1, 3}, raw(h)},
                        {"d.empty", "F32", {0, 5}, ""},
                        {"e.i32", "I32", {3}, raw(i32)}},
                       json{{"format", "pt"}}));

  SafetensorsFile f(p);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a.f32", "b.bf16", "c.f16", "d.empty", "e.i32"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_FALSE(f.has("__metadata__"));

  WeightView a = f.get("a.f32");
  EXPECT_EQ(a.name, "a.f32");
  EXPECT_EQ(a.dtype, DType::F32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.nbytes, 24u);
  EXPECT_EQ(a.numel(), 6);
  std::vector<float> af = to_f32(a);
  ASSERT_EQ(af.size(), f32.size());
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(af[i], f32[i]) << i;
  EXPECT_TRUE(std::signbit(af[4]));

  std::vector<float> bff = to_f32(f.get("b.bf16"));
  EXPECT_EQ(bff[0], 1.0f);
  EXPECT_EQ(bff[1], -2.5f);
  EXPECT_EQ(bff[2], 0.15625f);
  EXPECT_EQ(bff[3], 3.140625f);  // pi rounded to 8 significant bits

  WeightView c = f.get("c.f16");
  EXPECT_EQ(c.dtype, DType::F16);
  EXPECT_EQ(c.shape, (std::vector<int64_t>{2, 1, 3}));
  std::vector<float> hf = to_f32(c);
  EXPECT_EQ(hf[0], 0.5f);
  EXPECT_EQ(hf[1], -1.25f);
  EXPECT_EQ(hf[2], 65504.0f);
  EXPECT_EQ(hf[3], 6.103515625e-05f);         // smallest normal
  EXPECT_EQ(hf[4], 5.9604644775390625e-08f);  // smallest subnormal
  EXPECT_EQ(hf[5], 0.0999755859375f);         // 0.1 in f16

  WeightView d = f.get("d.empty");
  EXPECT_EQ(d.numel(), 0);
  EXPECT_EQ(d.nbytes, 0u);
  EXPECT_TRUE(to_f32(d).empty());

  EXPECT_EQ(to_f32(f.get("e.i32")), (std::vector<float>{-7.0f, 0.0f, 123456.0f}));
}

TEST(Safetensors, UnalignedDataIsReadCorrectly) {
  TempDir dir;
  // Pad the header so the data starts at an odd offset.
  const std::vector<float> v = {1.0f, 2.0f, 3.0f};
  json h = {{"x", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 12}}}}};
  std::string header = h.dump();
  while ((8 + header.size()) % 4 != 1) header += ' ';  // trailing whitespace is allowed padding
  const fs::path p = dir.path() / "x.safetensors";
  write_bytes(p, safetensors_bytes(header, raw(v)));
  SafetensorsFile f(p);
  EXPECT_EQ(to_f32(f.get("x")), v);
}

TEST(Safetensors, KnownButUnsupportedDtypeFailsOnlyWhenRequested) {
  TempDir dir;
  const fs::path p = dir.path() / "m.safetensors";
  write_bytes(p, build({{"w", "F32", {1}, f32_bytes({1.0f})}, {"mask", "BOOL", {3}, std::string("\1\0\1", 3)},
                        {"d", "F64", {1}, std::string(8, '\0')}}));
  SafetensorsFile f(p);
  EXPECT_TRUE(f.has("mask"));
  EXPECT_EQ(to_f32(f.get("w")), std::vector<float>{1.0f});
  EXPECT_THAT(error_of([&] { f.get("d"); }), HasSubstr("[weights] tensor \"d\""));
  EXPECT_THAT(error_of([&] { f.get("d"); }), HasSubstr("dtype F64 is not supported"));
  EXPECT_THAT(error_of([&] { f.get("mask"); }), HasSubstr("dtype BOOL is not supported"));
}

TEST(SafetensorsErrors, FileShorterThanEightBytes) {
  TempDir dir;
  const std::string msg = open_error(dir, "abc");
  EXPECT_THAT(msg, HasSubstr("[safetensors]"));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("shorter than the 8-byte header length"));
  EXPECT_THAT(open_error(dir, ""), HasSubstr("file is 0 bytes"));
}

TEST(SafetensorsErrors, HeaderLengthPastEndOfFile) {
  TempDir dir;
  std::string bytes = safetensors_bytes("{}", "");
  uint64_t n = 1000;
  std::memcpy(bytes.data(), &n, 8);
  EXPECT_THAT(open_error(dir, bytes), HasSubstr("header length 1000 runs past the end of the file (10 bytes)"));
}

TEST(SafetensorsErrors, HeaderNotJson) {
  TempDir dir;
  const std::string msg = open_error(dir, safetensors_bytes("{\"a\": [1, 2", ""));
  EXPECT_THAT(msg, HasSubstr("header is not valid JSON"));
  EXPECT_THAT(msg, HasSubstr("at byte"));
}

TEST(SafetensorsErrors, HeaderNotAnObject) {
  TempDir dir;
  EXPECT_THAT(open_error(dir, safetensors_bytes("[1, 2, 3]", "")), HasSubstr("header is not a JSON object"));
}

TEST(SafetensorsErrors, EntryNotAnObject) {
  TempDir dir;
  EXPECT_THAT(open_error(dir, safetensors_bytes(R"({"w": 3})", "")), HasSubstr("tensor \"w\": entry is not an object"));
}

TEST(SafetensorsErrors, UnknownDtypeIsNamed) {
  TempDir dir;
  const std::string h = R"({"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]}})";
  EXPECT_THAT(open_error(dir, safetensors_bytes(h, "xx")), HasSubstr("tensor \"w\": unknown dtype \"Q7\""));
}

TEST(SafetensorsErrors, MissingFieldsAreNamed) {
  TempDir dir;
  EXPECT_THAT(open_error(dir, safetensors_bytes(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", "abcd")),
              HasSubstr("tensor \"w\": missing \"dtype\""));
  EXPECT_THAT(open_error(dir, safetensors_bytes(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", "abcd")),
              HasSubstr("tensor \"w\": missing \"shape\""));
  EXPECT_THAT(open_error(dir, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [1]}})", "abcd")),
              HasSubstr("tensor \"w\": missing \"data_offsets\""));
}

TEST(SafetensorsErrors, BadShapeAndOffsetsValues) {
  TempDir dir;
  EXPECT_THAT(
      open_error(dir, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "abcd")),
      HasSubstr("\"shape\" must be a list of non-negative integers"));
  EXPECT_THAT(
      open_error(dir, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", "abcd")),
      HasSubstr("\"data_offsets\" must be [begin, end]"));
  EXPECT_THAT(
      open_error(dir,
                 safetensors_bytes(
                     R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 4]}})", "abcd")),
      HasSubstr("too large"));
}

TEST(SafetensorsErrors, ShapeAndOffsetsSizeMismatch) {
  TempDir dir;
  const std::string h = R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})";
  EXPECT_THAT(open_error(dir, safetensors_bytes(h, std::string(24, '\0'))),
              HasSubstr("tensor \"w\": size mismatch: shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 20] "
                        "hold 20"));
}

TEST(SafetensorsErrors, EndBeforeBegin) {
  TempDir dir;
  const std::string h = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})";
  EXPECT_THAT(open_error(dir, safetensors_bytes(h, std::string(8, '\0'))),
              HasSubstr("tensor \"w\": data_offsets [8, 4] end before begin"));
}

TEST(SafetensorsErrors, OffsetsOutOfRange) {
  TempDir dir;
  const std::string h = R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  const std::string msg = open_error(dir, safetensors_bytes(h, std::string(8, '\0')));
  EXPECT_THAT(msg, HasSubstr("tensor \"w\": data_offsets [0, 16] out of range: the data section has 8 bytes"));
}

TEST(SafetensorsErrors, TruncatedFile) {
  TempDir dir;
  std::string bytes = build({{"a", "F32", {4}, f32_bytes({1, 2, 3, 4})}, {"b", "F32", {4}, f32_bytes({5, 6, 7, 8})}});
  bytes.resize(bytes.size() - 5);
  const std::string msg = open_error(dir, bytes);
  EXPECT_THAT(msg, HasSubstr("tensor \"b\""));
  EXPECT_THAT(msg, HasSubstr("truncated"));
}

TEST(SafetensorsErrors, OverlappingTensors) {
  TempDir dir;
  const std::string h = R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                            "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})";
  EXPECT_THAT(open_error(dir, safetensors_bytes(h, std::string(24, '\0'))),
              HasSubstr("tensors \"a\" [0, 16] and \"b\" [8, 24] overlap"));
}

TEST(SafetensorsErrors, DataMustStartAtZeroWithoutGaps) {
  TempDir dir;
  const std::string start = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  EXPECT_THAT(open_error(dir, safetensors_bytes(start, std::string(8, '\0'))),
              HasSubstr("tensor \"a\" starts at byte 4 of the data section, expected 0"));
  const std::string gap = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                              "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})";
  EXPECT_THAT(open_error(dir, safetensors_bytes(gap, std::string(12, '\0'))),
              HasSubstr("gap between tensor \"a\" (ends at 4) and \"b\" (starts at 8)"));
}

TEST(SafetensorsErrors, MissingFileIsReported) {
  TempDir dir;
  EXPECT_THAT(error_of([&] { SafetensorsFile f(dir.path() / "nope.safetensors"); }),
              HasSubstr("nope.safetensors: cannot open"));
}

TEST(SafetensorsWeightStore, SingleFileLookupsAndShapeCheck) {
  TempDir dir;
  std::vector<float> q(64 * 32, 0.5f);
  write_bytes(dir.path() / "model.safetensors",
              build({{"model.layers.3.self_attn.q_proj.weight", "F32", {64, 32}, raw(q)},
                     {"model.norm.weight", "F32", {2}, f32_bytes({1.0f, 2.0f})}}));
  WeightStore store(dir.path());
  EXPECT_EQ(store.num_files(), 1u);
  EXPECT_TRUE(store.has("model.norm.weight"));
  EXPECT_FALSE(store.has("lm_head.weight"));
  EXPECT_EQ(store.names().size(), 2u);
  EXPECT_EQ(to_f32(store.get("model.norm.weight", {2})), (std::vector<float>{1.0f, 2.0f}));

  EXPECT_EQ(error_of([&] { store.get("model.layers.3.self_attn.q_proj.weight", {64, 64}); }),
            "[weights] tensor \"model.layers.3.self_attn.q_proj.weight\": expected shape [64, 64], found [64, 32]");
  EXPECT_EQ(error_of([&] { store.get("lm_head.weight"); }),
            "[weights] missing tensor \"lm_head.weight\" in " + dir.path().string());
}

TEST(SafetensorsWeightStore, ShardedIndexResolvesAcrossFiles) {
  TempDir dir;
  write_bytes(dir.path() / "model-00001-of-00002.safetensors",
              build({{"model.embed_tokens.weight", "F32", {2, 2}, f32_bytes({1, 2, 3, 4})},
                     {"model.layers.0.mlp.up_proj.weight", "BF16", {1}, raw(std::vector<uint16_t>{f32_to_bf16(-3.0f)})}}));
  write_bytes(dir.path() / "model-00002-of-00002.safetensors",
              build({{"lm_head.weight", "F16", {2}, raw(std::vector<uint16_t>{f32_to_f16(0.25f), f32_to_f16(8.0f)})}}));
  json index = {{"metadata", {{"total_size", 22}}},
                {"weight_map",
                 {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                  {"model.layers.0.mlp.up_proj.weight", "model-00001-of-00002.safetensors"},
                  {"lm_head.weight", "model-00002-of-00002.safetensors"}}}};
  write_bytes(dir.path() / "model.safetensors.index.json", index.dump(2));

  WeightStore store(dir.path());
  EXPECT_EQ(store.num_files(), 2u);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight",
                                                     "model.layers.0.mlp.up_proj.weight"}));
  EXPECT_EQ(to_f32(store.get("model.embed_tokens.weight", {2, 2})), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(to_f32(store.get("model.layers.0.mlp.up_proj.weight")), std::vector<float>{-3.0f});
  EXPECT_EQ(to_f32(store.get("lm_head.weight")), (std::vector<float>{0.25f, 8.0f}));
}

TEST(SafetensorsWeightStore, IndexErrorsNameTheShard) {
  TempDir dir;
  write_bytes(dir.path() / "a.safetensors", build({{"x", "F32", {1}, f32_bytes({1.0f})}}));
  auto with_index = [&](const json& j) {
    write_bytes(dir.path() / "model.safetensors.index.json", j.dump());
    return error_of([&] { WeightStore s(dir.path()); });
  };
  EXPECT_THAT(with_index({{"weight_map", {{"x", "missing.safetensors"}}}}),
              HasSubstr("shard \"missing.safetensors\" (holding \"x\") does not exist"));
  EXPECT_THAT(with_index({{"weight_map", {{"y", "a.safetensors"}}}}),
              HasSubstr("tensor \"y\" is mapped to shard \"a.safetensors\", which does not contain it"));
  EXPECT_THAT(with_index({{"weight_map", {{"x", "../a.safetensors"}}}}),
              HasSubstr("is not a file name in the model directory"));
  EXPECT_THAT(with_index({{"metadata", {}}}), HasSubstr("missing \"weight_map\""));
  write_bytes(dir.path() / "model.safetensors.index.json", "{\"weight_map\": ");
  EXPECT_THAT(error_of([&] { WeightStore s(dir.path()); }), HasSubstr("malformed JSON at byte"));
}

TEST(SafetensorsWeightStore, EmptyDirectoryIsAnError) {
  TempDir dir;
  EXPECT_THAT(error_of([&] { WeightStore s(dir.path()); }),
              HasSubstr("[weights] no model.safetensors or model.safetensors.index.json in"));
}

TEST(SafetensorsWeightStore, MalformedShardFailsOnOpen) {
  TempDir dir;
  write_bytes(dir.path() / "model.safetensors", "short");
  EXPECT_THAT(error_of([&] { WeightStore s(dir.path()); }), HasSubstr("model.safetensors: file is 5 bytes"));
}

TEST(Safetensors, MappedFileMovesOwnership) {
  TempDir dir;
  const fs::path p = dir.path() / "m.bin";
  write_bytes(p, "hello world");
  MappedFile a(p);
  ASSERT_EQ(a.size(), 11u);
  const std::byte* data = a.data();
  MappedFile b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size(), 11u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(std::memcmp(b.data(), "hello world", 11), 0);
}

}  // namespace
}  // namespace kvgraph
