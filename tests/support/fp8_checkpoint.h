#pragma once
// FP8 (e4m3) checkpoints made from the f32 fixtures, for tests: an independent
// e4m3 codec (values from the format's formula with std::ldexp, encoding by
// nearest value with ties to the even code, not from kvgraph/fp8.h) and the
// two layouts kvgraph loads, as transformers and compressed-tensors write them:
//   block:   "X.weight" F8_E4M3 [N, K], "X.weight_scale_inv" F32 [ceil(N/bn), ceil(K/bk)],
//            config "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [bn, bk]}
//   channel: "X.weight" F8_E4M3 [N, K], "X.weight_scale" [N, 1] (F32 or BF16),
//            config "quant_method": "compressed-tensors", "format": "float-quantized"
//   tensor:  as channel with "X.weight_scale" [1]
// Scales are absmax / 448 of their block, row or matrix (1 where all zero).
// Embeddings and lm_head stay in float (transformers' modules_to_not_convert,
// compressed-tensors' "ignore").
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "support/mlx_checkpoint.h"

namespace kvgraph::testing {

// The value of an e4m3 code by the OCP FP8 definition: (-1)^s * 2^(e-7) *
// (1 + m/8) for e > 0, (-1)^s * 2^-6 * m/8 for e = 0, NaN for S.1111.111.
inline float reference_e4m3(uint8_t code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::nanf("");
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return static_cast<float>(s ? -mag : mag);
}

// The e4m3 code nearest x (ties to the even code), saturating at +-448, as
// torch's clamp-then-cast does.
inline uint8_t reference_encode_e4m3(float x) {
  static const std::array<float, 127> values = [] {
    std::array<float, 127> v{};
    for (int c = 0; c < 127; ++c) v[c] = reference_e4m3(static_cast<uint8_t>(c));
    return v;
  }();
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::min(std::fabs(x), 448.0f);
  const auto hi = std::lower_bound(values.begin(), values.end(), a);  // first >= a
  int c = static_cast<int>(hi - values.begin());
  if (c > 0 && values[c] != a) {
    const float up = values[c] - a, down = a - values[c - 1];
    if (down < up || (down == up && (c - 1) % 2 == 0)) c = c - 1;
  }
  return static_cast<uint8_t>(sign | c);
}

enum class Fp8Layout { block, channel, tensor };

struct Fp8Options {
  Fp8Layout layout = Fp8Layout::block;
  int block_n = 128, block_k = 128;
  bool bf16_scales = false;  // channel / tensor: "X.weight_scale" in BF16
};

inline bool fp8_matrix(const std::string& name) {
  return name.size() > 12 && name.compare(name.size() - 12, 12, "_proj.weight") == 0;
}

inline MlxCheckpoint make_fp8(const std::filesystem::path& src, const Fp8Options& o) {
  MlxCheckpoint m;
  m.config = nlohmann::json::parse(read_file(src / "config.json"));
  if (o.layout == Fp8Layout::block) {
    m.config["quantization_config"] = {{"quant_method", "fp8"},
                                       {"fmt", "e4m3"},
                                       {"activation_scheme", "dynamic"},
                                       {"weight_block_size", {o.block_n, o.block_k}},
                                       {"modules_to_not_convert", nullptr}};
  } else {
    nlohmann::json weights = {{"num_bits", 8},   {"type", "float"},      {"symmetric", true},
                              {"dynamic", false}, {"group_size", nullptr}, {"observer", "minmax"},
                              {"strategy", o.layout == Fp8Layout::channel ? "channel" : "tensor"}};
    nlohmann::json acts = {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}, {"symmetric", true}};
    m.config["quantization_config"] = {
        {"quant_method", "compressed-tensors"},
        {"format", "float-quantized"},
        {"quantization_status", "compressed"},
        {"ignore", {"lm_head"}},
        {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", acts}}}}}};
  }
  for (const auto& [name, e] : read_checkpoint(src / "model.safetensors")) {
    if (!fp8_matrix(name) || e.shape.size() != 2) {
      m.tensors[name] = e;
      continue;
    }
    const int64_t N = e.shape[0], K = e.shape[1];
    const std::vector<float> w = floats_of(e);
    // Scale index of element (n, k) and the scales' shape.
    int64_t sr = 1, sc = 1;
    if (o.layout == Fp8Layout::block) {
      sr = (N + o.block_n - 1) / o.block_n;
      sc = (K + o.block_k - 1) / o.block_k;
    } else if (o.layout == Fp8Layout::channel) {
      sr = N;
    }
    auto at = [&](int64_t n, int64_t k) -> int64_t {
      if (o.layout == Fp8Layout::block) return (n / o.block_n) * sc + k / o.block_k;
      return o.layout == Fp8Layout::channel ? n : 0;
    };
    std::vector<float> absmax(sr * sc, 0.0f);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) absmax[at(n, k)] = std::max(absmax[at(n, k)], std::fabs(w[n * K + k]));
    std::vector<float> scale(absmax.size());
    for (size_t i = 0; i < scale.size(); ++i) {
      scale[i] = absmax[i] > 0 ? absmax[i] / 448.0f : 1.0f;
      if (o.bf16_scales) scale[i] = bf16_to_f32(f32_to_bf16(scale[i]));  // quantize with the scale as stored
    }
    std::vector<uint8_t> codes(N * K);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) codes[n * K + k] = reference_encode_e4m3(w[n * K + k] / scale[at(n, k)]);
    m.tensors[name] = entry_of("F8_E4M3", {N, K}, codes);
    const std::string base = base_of(name);
    const std::vector<int64_t> sshape =
        o.layout == Fp8Layout::block ? std::vector<int64_t>{sr, sc}
                                     : (o.layout == Fp8Layout::channel ? std::vector<int64_t>{N, 1} : std::vector<int64_t>{1});
    const std::string sname = base + (o.layout == Fp8Layout::block ? ".weight_scale_inv" : ".weight_scale");
    if (o.bf16_scales) {
      std::vector<uint16_t> s16;
      for (float v : scale) s16.push_back(f32_to_bf16(v));
      m.tensors[sname] = entry_of("BF16", sshape, s16);
    } else {
      m.tensors[sname] = entry_of("F32", sshape, scale);
    }
  }
  return m;
}

// The same checkpoint with each fp8 matrix replaced by the values it stands
// for, reference_e4m3(code) * scale in f32, read back from the stored bytes:
// a plain f32 checkpoint.
inline MlxCheckpoint fp8_dequantised(const MlxCheckpoint& q) {
  MlxCheckpoint m;
  m.config = q.config;
  m.config.erase("quantization_config");
  for (const auto& [name, e] : q.tensors) {
    auto ends = [&](const std::string& s) {
      return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends(".weight_scale_inv") || ends(".weight_scale")) continue;
    if (e.dtype != "F8_E4M3") {
      m.tensors[name] = e;
      continue;
    }
    const int64_t N = e.shape[0], K = e.shape[1];
    const bool block = q.tensors.count(base_of(name) + ".weight_scale_inv") > 0;
    const Entry& se = q.tensors.at(base_of(name) + (block ? ".weight_scale_inv" : ".weight_scale"));
    const std::vector<float> s = floats_of(se);
    std::vector<float> w(N * K);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        int64_t i = 0;
        if (block) {
          const int bs_n = q.config["quantization_config"]["weight_block_size"][0];
          const int bs_k = q.config["quantization_config"]["weight_block_size"][1];
          i = (n / bs_n) * se.shape[1] + k / bs_k;
        } else if (se.shape.size() == 2) {
          i = n;
        }
        w[n * K + k] = reference_e4m3(static_cast<uint8_t>(e.bytes[n * K + k])) * s[i];
      }
    m.tensors[name] = entry_of("F32", {N, K}, w);
  }
  return m;
}

// Every F32 tensor in BF16 (rounded to nearest even) and the config's dtype
// "bfloat16": a bf16 checkpoint.
inline MlxCheckpoint to_bf16(const MlxCheckpoint& f) {
  MlxCheckpoint m = f;
  m.config.erase("torch_dtype");
  m.config["dtype"] = "bfloat16";
  for (auto& [name, e] : m.tensors) {
    if (e.dtype != "F32") continue;
    std::vector<uint16_t> h;
    for (float v : values_of<float>(e)) h.push_back(f32_to_bf16(v));
    e = entry_of("BF16", e.shape, h);
  }
  return m;
}

}  // namespace kvgraph::testing
