#pragma once
// MLX-layout ("affine") quantized checkpoints made from the f32 fixtures, for
// tests: an independent quantizer and unpacker written from MLX's source
// (mlx/backend/cpu/quantized.cpp `quantize`, mlx/ops.cpp `dequantize`), not
// from kvgraph/quant.h, and the safetensors/config writing mlx-lm does.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvgraph/dtype.h"
#include "support/files.h"

namespace kvgraph::testing {

struct Entry {
  std::string dtype;  // "F32", "BF16", "U32"
  std::vector<int64_t> shape;
  std::string bytes;
};
using Checkpoint = std::map<std::string, Entry>;

struct MlxCheckpoint {
  nlohmann::json config;
  Checkpoint tensors;
};

inline Checkpoint read_checkpoint(const std::filesystem::path& file) {
  const SafetensorsParts p = read_safetensors(file);
  Checkpoint c;
  for (auto it = p.header.begin(); it != p.header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const uint64_t b = it.value()["data_offsets"][0], e = it.value()["data_offsets"][1];
    c[it.key()] = {it.value()["dtype"], it.value()["shape"].get<std::vector<int64_t>>(), p.data.substr(b, e - b)};
  }
  return c;
}

inline void write_checkpoint(const std::filesystem::path& dir, const MlxCheckpoint& m) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << m.config.dump(2);
  nlohmann::json header = nlohmann::json::object();
  std::string body;
  for (const auto& [name, e] : m.tensors) {
    header[name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {body.size(), body.size() + e.bytes.size()}}};
    body += e.bytes;
  }
  write_bytes(dir / "model.safetensors", safetensors_bytes(header.dump(), body));
}

template <typename T>
std::vector<T> values_of(const Entry& e) {
  std::vector<T> v(e.bytes.size() / sizeof(T));
  std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
  return v;
}
template <typename T>
Entry entry_of(const std::string& dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
  return {dtype, std::move(shape), std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T))};
}
inline std::vector<float> floats_of(const Entry& e) {
  if (e.dtype == "F32") return values_of<float>(e);
  std::vector<float> f;
  for (uint16_t h : values_of<uint16_t>(e)) f.push_back(bf16_to_f32(h));  // BF16
  return f;
}

// MLX's rule for one group of `n` values (in f32, rint = round half to even):
// the codes, the scale and the bias.
struct Group {
  std::vector<uint32_t> codes;
  float scale, bias;
};
inline Group reference_group(const float* w, int n, int bits) {
  const float n_bins = float((1 << bits) - 1);
  float w_min = w[0], w_max = w[0];
  for (int i = 1; i < n; ++i) {
    w_min = std::min(w_min, w[i]);
    w_max = std::max(w_max, w[i]);
  }
  const bool min_is_edge = std::abs(w_min) > std::abs(w_max);
  float scale = std::max((w_max - w_min) / n_bins, 1e-7f);
  if (!min_is_edge) scale = -scale;
  const float edge = min_is_edge ? w_min : w_max;
  const float q0 = std::nearbyint(edge / scale);
  Group g{{}, scale, 0.0f};
  if (q0 != 0.0f) {
    g.scale = edge / q0;
    g.bias = edge;
  }
  for (int i = 0; i < n; ++i) {
    float q = std::nearbyint((w[i] - g.bias) / g.scale);
    q = q < 0.0f ? 0.0f : (q > n_bins ? n_bins : q);
    g.codes.push_back(static_cast<uint32_t>(q));
  }
  return g;
}

// A row's codes as a little-endian bit stream of `bits`-bit fields, cut into
// u32 words (MLX packs the first value in the low bits).
inline std::vector<uint32_t> reference_pack(const std::vector<uint32_t>& codes, int bits) {
  std::vector<uint32_t> words(codes.size() * bits / 32, 0u);
  for (size_t k = 0; k < codes.size(); ++k) {
    const size_t bit = k * bits;
    words[bit / 32] |= codes[k] << (bit % 32);
  }
  return words;
}

// The codes of `n` values from the stored bytes of packed words, read byte by
// byte (4 bits: low nibble first; 8 bits: one byte each).
inline std::vector<uint32_t> reference_unpack(const std::string& bytes, int64_t n, int bits) {
  std::vector<uint32_t> codes(n);
  for (int64_t k = 0; k < n; ++k) {
    const auto byte = static_cast<uint8_t>(bytes[bits == 8 ? k : k / 2]);
    codes[k] = bits == 8 ? byte : (k % 2 ? byte >> 4 : byte & 0xF);
  }
  return codes;
}

// mlx-lm quantizes every Linear and Embedding whose input dim is a multiple of the group.
inline bool is_matrix(const std::string& name) {
  auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends("_proj.weight") || ends("embed_tokens.weight") || ends("lm_head.weight");
}
inline std::string base_of(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - std::string(".weight").size());
}

// The f32 fixture at `src`, its matrices quantized as mlx-lm writes them:
// "X.weight" U32 [N, K * bits / 32], "X.scales" and "X.biases" [N, K / group]
// (F32, or BF16 with bf16_scales), config.json with "quantization" and
// "quantization_config".
inline MlxCheckpoint make_mlx(const std::filesystem::path& src, int bits, int group, bool bf16_scales = false) {
  MlxCheckpoint m;
  m.config = nlohmann::json::parse(read_file(src / "config.json"));
  m.config["quantization"] = {{"group_size", group}, {"bits", bits}};
  m.config["quantization_config"] = m.config["quantization"];
  if (bf16_scales) {
    m.config.erase("torch_dtype");
    m.config["dtype"] = "bfloat16";
  }
  for (const auto& [name, e] : read_checkpoint(src / "model.safetensors")) {
    if (!is_matrix(name) || e.shape.size() != 2 || e.shape[1] % group) {
      m.tensors[name] = e;
      continue;
    }
    const int64_t N = e.shape[0], K = e.shape[1];
    const std::vector<float> w = floats_of(e);
    std::vector<uint32_t> words;
    std::vector<float> scales, biases;
    for (int64_t r = 0; r < N; ++r) {
      std::vector<uint32_t> row;
      for (int64_t g = 0; g < K / group; ++g) {
        Group q = reference_group(w.data() + r * K + g * group, group, bits);
        row.insert(row.end(), q.codes.begin(), q.codes.end());
        scales.push_back(q.scale);
        biases.push_back(q.bias);
      }
      const std::vector<uint32_t> packed = reference_pack(row, bits);
      words.insert(words.end(), packed.begin(), packed.end());
    }
    m.tensors[name] = entry_of("U32", {N, K * bits / 32}, words);
    const std::string base = base_of(name);
    if (bf16_scales) {
      std::vector<uint16_t> s16, b16;
      for (float v : scales) s16.push_back(f32_to_bf16(v));
      for (float v : biases) b16.push_back(f32_to_bf16(v));
      m.tensors[base + ".scales"] = entry_of("BF16", {N, K / group}, s16);
      m.tensors[base + ".biases"] = entry_of("BF16", {N, K / group}, b16);
    } else {
      m.tensors[base + ".scales"] = entry_of("F32", {N, K / group}, scales);
      m.tensors[base + ".biases"] = entry_of("F32", {N, K / group}, biases);
    }
  }
  return m;
}

// The same checkpoint with its quantized matrices replaced by the values they
// stand for, scale * q + bias in f32 (fmaf), unpacked independently from
// the stored bytes: a plain f32 checkpoint.
inline MlxCheckpoint dequantised(const MlxCheckpoint& q) {
  const int bits = q.config["quantization"]["bits"], group = q.config["quantization"]["group_size"];
  MlxCheckpoint m;
  m.config = q.config;
  m.config.erase("quantization");
  m.config.erase("quantization_config");
  m.config.erase("torch_dtype");
  m.config["dtype"] = "float32";
  for (const auto& [name, e] : q.tensors) {
    const bool scales = name.size() > 7 && name.compare(name.size() - 7, 7, ".scales") == 0;
    const bool biases = name.size() > 7 && name.compare(name.size() - 7, 7, ".biases") == 0;
    if (scales || biases) continue;
    if (e.dtype != "U32") {
      m.tensors[name] = {"F32", e.shape, std::string()};
      const std::vector<float> f = floats_of(e);
      m.tensors[name].bytes.assign(reinterpret_cast<const char*>(f.data()), f.size() * 4);
      continue;
    }
    const int64_t N = e.shape[0], K = e.shape[1] * 32 / bits;
    const std::vector<uint32_t> codes = reference_unpack(e.bytes, N * K, bits);
    const std::vector<float> s = floats_of(q.tensors.at(base_of(name) + ".scales"));
    const std::vector<float> b = floats_of(q.tensors.at(base_of(name) + ".biases"));
    std::vector<float> w(N * K);
    for (int64_t i = 0; i < N * K; ++i) {
      const int64_t g = (i / K) * (K / group) + (i % K) / group;
      w[i] = std::fmaf(s[g], float(codes[i]), b[g]);
    }
    m.tensors[name] = entry_of("F32", {N, K}, w);
  }
  return m;
}

}  // namespace kvgraph::testing
