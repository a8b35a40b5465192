#pragma once
// MLX's "affine" quantization, the layout kvgraph reads and writes
// (mlx/ops.cpp `quantize`, mlx/backend/cpu/quantized.cpp `quantize` and
// `_qmm_t`):
//   - a row of K values is cut into groups of `group` consecutive values;
//     each group has a scale s and a bias b (stored in the model's float
//     type) and each value a code q in [0, 2^bits - 1]: w = s * q + b;
//   - codes are packed 32/bits to a uint32 word, the first value in the low
//     bits: value k of a row is bits (k % (32/bits)) * bits of word
//     k / (32/bits);
//   - quantizing a group (in f32): scale = max((max - min) / (2^bits - 1),
//     1e-7), signed and anchored so that the extreme of larger magnitude
//     (`edge`) is exact: scale = -scale unless |min| > |max|, q0 =
//     rint(edge / scale), then (q0 != 0) scale = edge / q0, bias = edge
//     (else bias = 0); q = clamp(rint((w - bias) / scale), 0, 2^bits - 1),
//     rint rounding half to even. The codes use the f32 scale; the stored
//     scale and bias are then rounded to the storage type.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kvgraph/dtype.h"

namespace kvgraph {

// Code of value k of a packed row.
KV_HD uint32_t affine_code(const uint32_t* row_words, int64_t k, int bits) {
  const int per = 32 / bits;
  return (row_words[k / per] >> ((k % per) * bits)) & ((1u << bits) - 1u);
}

// The value a code stands for, exactly as every kvgraph backend computes it.
KV_HD float affine_value(float scale, uint32_t code, float bias) {
  return fmaf(scale, static_cast<float>(code), bias);
}

#ifndef __CUDACC__
// Quantizes rows x K values (K % group == 0) as MLX does: codes packed into
// words [rows, K * bits / 32], f32 scales and biases [rows, K / group].
inline void affine_quantize(const float* w, int64_t rows, int64_t K, int bits, int group, uint32_t* words,
                            float* scales, float* biases) {
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  const int per = 32 / bits;
  const int64_t groups = K / group;
  for (int64_t r = 0; r < rows; ++r) {
    uint32_t* wr = words + r * (K / per);
    std::fill(wr, wr + K / per, 0u);
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = w + r * K + g * group;
      float lo = INFINITY, hi = -INFINITY;
      for (int j = 0; j < group; ++j) {
        hi = std::max(hi, v[j]);
        lo = std::min(lo, v[j]);
      }
      const bool mask = std::fabs(lo) > std::fabs(hi);
      float scale = std::max((hi - lo) / n_bins, eps);
      scale = mask ? scale : -scale;
      const float edge = mask ? lo : hi;
      const float q0 = std::rint(edge / scale);
      float bias = 0.0f;
      if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
      }
      for (int j = 0; j < group; ++j) {
        const float q = std::min(std::max(std::rint((v[j] - bias) / scale), 0.0f), n_bins);
        const int64_t k = g * group + j;
        wr[k / per] |= static_cast<uint32_t>(q) << ((k % per) * bits);
      }
      scales[r * groups + g] = scale;
      biases[r * groups + g] = bias;
    }
  }
}

// The values of rows x K quantized values, each affine_value(s, q, b), with
// scales and biases given as f32 (widen stored bf16 ones first: exact).
inline void affine_dequantize(const uint32_t* words, const float* scales, const float* biases, int64_t rows,
                              int64_t K, int bits, int group, float* out) {
  const int64_t groups = K / group, row_words = K * bits / 32;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = r * groups + k / group;
      out[r * K + k] = affine_value(scales[g], affine_code(words + r * row_words, k, bits), biases[g]);
    }
}
#endif

}  // namespace kvgraph
