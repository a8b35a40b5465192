#pragma once
// A weight matrix as the op set takes it: a plain float tensor, or MLX's
// "affine" quantization of one (packed uint32 words, per-group scales and
// biases). The layout and the quantization rule are in kvgraph/quant.h.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvgraph/tensor.h"

namespace kvgraph {

// bits 4 or 8 with a group of 32, 64 or 128 values along the input dim K;
// bits 0: not quantized.
struct QuantFormat {
  int bits = 0;
  int group = 0;
  // Only in a load request (Model::load's `quantize`, `--weights fp8`):
  // round every linear layer ("*_proj.weight") to fp8 e4m3 with a scale per
  // 128 x 128 block, as transformers' fine-grained FP8 writes a checkpoint,
  // then load those values as floats (what that checkpoint would load to).
  bool fp8 = false;
  bool quantized() const { return bits != 0; }
  bool operator==(const QuantFormat&) const = default;
};

// True for the formats the kernels implement (4|8 bits, group 32|64|128).
inline bool supported(QuantFormat f) {
  return (f.bits == 4 || f.bits == 8) && (f.group == 32 || f.group == 64 || f.group == 128);
}
// "f32", "bf16" for plain weights; "int4/g64" for quantized ones.
inline std::string format_name(QuantFormat f, DType float_dtype) {
  if (!f.quantized()) return std::string(dtype_name(float_dtype));
  return "int" + std::to_string(f.bits) + "/g" + std::to_string(f.group);
}

struct Weight {
  // Plain: f32 | bf16 [N, K]. Quantized: u32 [N, K * bits / 32], row n's
  // element k in bits (k % (32/bits)) * bits of word k / (32/bits).
  Tensor w;
  Tensor scales, biases;  // quantized only: f32 | bf16 [N, K / group], the same dtype
  QuantFormat format;     // bits 0: plain

  Weight() = default;
  explicit Weight(Tensor plain) : w(std::move(plain)) {}

  bool defined() const { return w.defined(); }
  bool quantized() const { return format.quantized(); }
  Device device() const { return w.device(); }
  int64_t rows() const { return w.dim(0); }  // N
  int64_t cols() const { return quantized() ? w.dim(1) * 32 / format.bits : w.dim(1); }  // K
  // The float type of the values: w's for plain weights, the scales' for
  // quantized ones (a bias added to the product must have it too).
  DType float_dtype() const { return quantized() ? scales.dtype() : w.dtype(); }
  size_t nbytes() const { return w.nbytes() + (quantized() ? scales.nbytes() + biases.nbytes() : 0); }
  // Bytes of one row (an embedding lookup reads one).
  size_t row_bytes() const { return rows() > 0 ? nbytes() / static_cast<size_t>(rows()) : 0; }
  // Same storage (a tied lm_head is the embedding).
  bool same_as(const Weight& o) const { return defined() && o.defined() && w.raw() == o.w.raw(); }
};

}  // namespace kvgraph
