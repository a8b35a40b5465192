#pragma once
// Quantize-on-write and dequantize arithmetic of the KV formats
// (kv_format.h), defined once for the CPU loops, the CUDA kernels and the
// tests (__host__ __device__ under nvcc), so both backends store the same
// bytes for the same input row.
//
// int8 / int4, affine groups (MLX's value rule, value = fmaf(scale, code,
// bias), quant.h's affine_value; scale and bias stored as f16). Per group of
// `group` values:
//   lo, hi = the group's min and max (values clamped to the f16 range first);
//   bias  = lo rounded DOWN to f16, scale = (hi - bias) / (2^bits - 1)
//           rounded UP to f16 (at least the smallest f16 subnormal);
//   code  = clamp(rint((x - bias) / scale), 0, 2^bits - 1).
// Rounding bias down and scale up before the codes are chosen keeps every
// value inside [bias, bias + (2^bits - 1) * scale], so the round trip is
// within scale / 2 (plus f32 rounding) for every element, whatever the
// offset of the group: a K row with a large per-channel offset (Qwen2's
// k_proj bias) keeps its precision. This is why the anchoring differs from
// MLX's weight quantizer (quant.h), which makes the group's extreme of larger
// magnitude exact in f32 and then rounds bias and scale to the storage type:
// with an f16 bias of 100 that rounding alone is 0.03, many int8 scales.
//
// fp8 e4m3, one f32 scale per row (token, head): scale = max|x| / 448
// (1 when the row is zero), code = e4m3(x / scale) rounded to nearest even
// and saturated to +-448, value = e4m3_to_f32(code) * scale. The round trip
// is within 2^-4 |x| (3 mantissa bits) or 2^-10 scale (subnormals).
//
// A group (affine) or row (fp8) holding a NaN or an infinity gets a NaN
// scale: its values read back as NaN, so a broken activation stays visible
// (the logits turn NaN and sampling reports it) instead of being clamped.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvgraph/cache/kv_format.h"
#include "kvgraph/dtype.h"
#include "kvgraph/quant.h"

namespace kvgraph {

constexpr float kF16Max = 65504.0f;
constexpr float kE4m3Max = 448.0f;

KV_HD float kv_bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
KV_HD uint32_t kv_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
KV_HD bool kv_finite(float f) { return (kv_f32_bits(f) & 0x7f800000u) != 0x7f800000u; }

// ---------------------------------------------------------------- f16, directed

// The f16 next to h towards -inf / +inf (h finite; +-0 step to the smallest subnormal).
KV_HD uint16_t f16_next_down(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x8001u;
  return (h & 0x8000u) ? uint16_t(h + 1) : uint16_t(h - 1);
}
KV_HD uint16_t f16_next_up(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x0001u;
  return (h & 0x8000u) ? uint16_t(h - 1) : uint16_t(h + 1);
}
// Largest f16 <= x and smallest f16 >= x, for finite x within +-65504.
KV_HD uint16_t f16_round_down(float x) {
  const uint16_t h = f32_to_f16(x);
  return f16_to_f32(h) > x ? f16_next_down(h) : h;
}
KV_HD uint16_t f16_round_up(float x) {
  const uint16_t h = f32_to_f16(x);
  return f16_to_f32(h) < x ? f16_next_up(h) : h;
}

// ---------------------------------------------------------------- affine (int8, int4)

// One group's (scale, bias) as stored: f16 bits. `finite`: no NaN or
// infinity in the group (else the scale is NaN).
struct KvAffineParams {
  uint16_t scale = 0, bias = 0;
};

KV_HD float kv_clamp_f16_range(float x) { return fminf(fmaxf(x, -kF16Max), kF16Max); }

// lo and hi: the min and max of the group's values after kv_clamp_f16_range.
KV_HD KvAffineParams kv_affine_params(float lo, float hi, int bits, bool finite) {
  if (!finite) return {0x7e00u, 0};  // NaN scale
  const float n_bins = float((1 << bits) - 1);
  const uint16_t b = f16_round_down(lo);
  uint16_t s = f16_round_up((hi - f16_to_f32(b)) / n_bins);
  if ((s & 0x7fffu) == 0) s = 0x0001u;  // a constant group: any positive scale
  return {s, b};
}

KV_HD uint32_t kv_affine_code(float x, float scale, float bias, int bits) {
  const float n_bins = float((1 << bits) - 1);
  return uint32_t(fminf(fmaxf(rintf((kv_clamp_f16_range(x) - bias) / scale), 0.0f), n_bins));
}

// Params word of a group as the aux pool holds it: scale in the low half,
// bias in the high half (little-endian u32).
KV_HD uint32_t kv_affine_word(KvAffineParams p) { return uint32_t(p.scale) | uint32_t(p.bias) << 16; }
KV_HD float kv_affine_scale(uint32_t word) { return f16_to_f32(uint16_t(word & 0xffffu)); }
KV_HD float kv_affine_bias(uint32_t word) { return f16_to_f32(uint16_t(word >> 16)); }

// ---------------------------------------------------------------- fp8 e4m3

// f32 -> e4m3, round to nearest even, saturating to +-448 (NaN -> 0x7f).
KV_HD uint8_t f32_to_e4m3(float f) {
  const uint32_t u = kv_f32_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7fu);
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // >= 448
  if (a < 0x3c800000u) {                               // below 2^-6: subnormal, steps of 2^-9
    const float m = rintf(kv_bits_to_f32(a) * 512.0f);  // exact scaling, then round half to even
    return uint8_t(sign | uint32_t(m));                // m == 8 is the smallest normal, 0x08
  }
  uint32_t r = ((((a >> 23) - 127u + 7u) << 3) | ((a >> 20) & 7u));
  const uint32_t rem = a & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;  // may carry into the exponent: still exact
  if (r > 0x7eu) r = 0x7eu;
  return uint8_t(sign | r);
}

KV_HD float e4m3_to_f32(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xfu, m = c & 7u;
  if (e == 15 && m == 7) return kv_bits_to_f32(sign | 0x7fc00000u);
  if (e == 0) return kv_bits_to_f32(sign | kv_f32_bits(float(m) * 0.001953125f));  // m * 2^-9, exact
  return kv_bits_to_f32(sign | ((e - 7u + 127u) << 23) | (m << 20));
}

// absmax: max |x| over the row; finite: no NaN or infinity in it.
KV_HD float kv_fp8_scale(float absmax, bool finite) {
  if (!finite) return kv_bits_to_f32(0x7fc00000u);
  return absmax > 0.0f ? absmax / kE4m3Max : 1.0f;
}
KV_HD uint8_t kv_fp8_code(float x, float scale) { return f32_to_e4m3(x / scale); }
KV_HD float kv_fp8_value(uint8_t code, float scale) { return e4m3_to_f32(code) * scale; }

// ---------------------------------------------------------------- whole rows

// Stores one row of D values in format f: codes (code_bytes(D)) and aux
// (aux_bytes(D)); plain formats round to their dtype and use no aux.
KV_HD void kv_quantize_row(KvFormat f, const float* x, int D, uint8_t* codes, uint8_t* aux) {
  switch (f.type) {
    case KvType::F32: memcpy(codes, x, size_t(D) * 4); return;
    case KvType::BF16:
    case KvType::F16:
      for (int d = 0; d < D; ++d) {
        const uint16_t h = f.type == KvType::BF16 ? f32_to_bf16(x[d]) : f32_to_f16(x[d]);
        memcpy(codes + 2 * d, &h, 2);
      }
      return;
    case KvType::Int8:
    case KvType::Int4: {
      const int bits = f.bits();
      for (int g0 = 0; g0 < D; g0 += f.group) {
        float lo = INFINITY, hi = -INFINITY;
        bool finite = true;
        for (int d = g0; d < g0 + f.group; ++d) {
          finite = finite && kv_finite(x[d]);
          const float c = kv_clamp_f16_range(x[d]);
          lo = fminf(lo, c);
          hi = fmaxf(hi, c);
        }
        const KvAffineParams p = kv_affine_params(lo, hi, bits, finite);
        const uint32_t w = kv_affine_word(p);
        memcpy(aux + g0 / f.group * 4, &w, 4);
        const float s = f16_to_f32(p.scale), b = f16_to_f32(p.bias);
        for (int d = g0; d < g0 + f.group; ++d) {
          const uint32_t q = kv_affine_code(x[d], s, b, bits);
          if (bits == 8) {
            codes[d] = uint8_t(q);
          } else if (d % 2 == 0) {
            codes[d / 2] = uint8_t(q);
          } else {
            codes[d / 2] = uint8_t(codes[d / 2] | (q << 4));
          }
        }
      }
      return;
    }
    case KvType::Fp8: {
      float absmax = 0.0f;
      bool finite = true;
      for (int d = 0; d < D; ++d) {
        finite = finite && kv_finite(x[d]);
        absmax = fmaxf(absmax, fabsf(x[d]));
      }
      const float s = kv_fp8_scale(absmax, finite);
      memcpy(aux, &s, 4);
      for (int d = 0; d < D; ++d) codes[d] = kv_fp8_code(x[d], s);
      return;
    }
    case KvType::Invalid: return;
  }
}

// The values of one stored row (what attention reads).
KV_HD void kv_dequantize_row(KvFormat f, const uint8_t* codes, const uint8_t* aux, int D, float* out) {
  switch (f.type) {
    case KvType::F32: memcpy(out, codes, size_t(D) * 4); return;
    case KvType::BF16:
    case KvType::F16:
      for (int d = 0; d < D; ++d) {
        uint16_t h;
        memcpy(&h, codes + 2 * d, 2);
        out[d] = f.type == KvType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      return;
    case KvType::Int8:
    case KvType::Int4:
      for (int g0 = 0; g0 < D; g0 += f.group) {
        uint32_t w;
        memcpy(&w, aux + g0 / f.group * 4, 4);
        const float s = kv_affine_scale(w), b = kv_affine_bias(w);
        for (int d = g0; d < g0 + f.group; ++d) {
          const uint32_t q = f.type == KvType::Int8 ? codes[d] : (codes[d / 2] >> (4 * (d % 2))) & 0xfu;
          out[d] = affine_value(s, q, b);
        }
      }
      return;
    case KvType::Fp8: {
      float s;
      memcpy(&s, aux, 4);
      for (int d = 0; d < D; ++d) out[d] = kv_fp8_value(codes[d], s);
      return;
    }
    case KvType::Invalid: return;
  }
}

}  // namespace kvgraph
