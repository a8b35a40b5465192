#pragma once
// FP8 e4m3 ("e4m3fn", OCP FP8 / torch.float8_e4m3fn) for checkpoint weights:
// 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 holds
// subnormals (m/8 * 2^-6), S.1111.111 (0x7F, 0xFF) is NaN, and there are no
// infinities (S.1111.000 .. S.1111.110 are the normals 256 .. 448). Every
// code is exact in f32. The codec itself (f32_to_e4m3, e4m3_to_f32, written
// from the bits) is the KV cache's fp8 format's, in cache/kv_quant.h; this
// header adds what the weight loader needs.
//
// Checkpoints store fp8 matrices with float scales (Fp8Format in
// model_config.h, docs/design.md "FP8 checkpoints"); kvgraph dequantizes them
// at load.
#include <cstdint>

#include "kvgraph/cache/kv_quant.h"

namespace kvgraph {

KV_HD bool e4m3_is_nan(uint8_t code) { return (code & 0x7Fu) == 0x7Fu; }

}  // namespace kvgraph
