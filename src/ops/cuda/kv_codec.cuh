#pragma once
// Quantized KV formats on the device (kvgraph/cache/kv_format.h): format
// tags, loads of 8 codes with their group's scale and bias, conversion of
// codes to floats without I2F, and the block-cooperative quantizer of one
// row. The arithmetic is kv_quant.h's, so a row quantized here has the same
// bytes as the CPU's for the same input, and a dequantized value is the same
// float (fmaf(scale, code, bias); e4m3 * scale).
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kvgraph/cache/kv_quant.h"
#include "ops/cuda/common.cuh"

namespace kvgraph::cuda::detail {

// Quantized storage tags, and the (K, V) pair a kernel is instantiated for.
struct q8 {};    // int8 affine groups
struct q4 {};    // int4 affine groups
struct e4m3 {};  // fp8 with a scale per row
template <typename KS, typename VS>
struct QKV {
  using K = KS;
  using V = VS;
};

template <typename S>
struct QTraits;
template <>
struct QTraits<q8> {
  static constexpr int kBits = 8;
  static constexpr bool kAffine = true;
  using Codes8 = uint2;  // 8 codes: 8 bytes
};
template <>
struct QTraits<q4> {
  static constexpr int kBits = 4;
  static constexpr bool kAffine = true;
  using Codes8 = uint32_t;  // 8 codes: 4 bytes
};
template <>
struct QTraits<e4m3> {
  static constexpr int kBits = 8;
  static constexpr bool kAffine = false;
  using Codes8 = uint2;
};

// One pool of quantized rows: codes [pool rows, code_row bytes] and aux
// [pool rows, aux_row bytes]; `group`: affine values per (scale, bias).
struct QPool {
  const uint8_t* codes;
  const uint8_t* aux;
  int code_row, aux_row, group;
};

// Codes of values [e0, e0 + 8) of a row (e0 a multiple of 8).
template <typename S>
__device__ __forceinline__ typename QTraits<S>::Codes8 load_codes8(const uint8_t* row, int e0) {
  if constexpr (std::is_same_v<S, q4>) {
    return *reinterpret_cast<const uint32_t*>(row + e0 / 2);
  } else {
    return *reinterpret_cast<const uint2*>(row + e0);
  }
}

// The params word of the group (affine: f16 scale | f16 bias << 16) or of the
// row (fp8: the f32 scale's bits) that holds element e.
template <typename S>
__device__ __forceinline__ uint32_t load_params(const uint8_t* aux_row, int e, int group) {
  if constexpr (QTraits<S>::kAffine) {
    return reinterpret_cast<const uint32_t*>(aux_row)[e / group];
  } else {
    return *reinterpret_cast<const uint32_t*>(aux_row);
  }
}

__device__ __forceinline__ float half_lo(uint32_t w) { return __half2float(__ushort_as_half(uint16_t(w & 0xffffu))); }
__device__ __forceinline__ float half_hi(uint32_t w) { return __half2float(__ushort_as_half(uint16_t(w >> 16))); }

// Byte i of w as an exact float: 0x4B0000xx is 2^23 + xx (one PRMT, one FADD).
__device__ __forceinline__ float byte_f(uint32_t w, int i) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | unsigned(i))) - 8388608.0f;
}

// The codes of one u32 word as floats, in element order: 4 values (int8:
// the codes 0..255; fp8: the e4m3 values) or 8 (int4: the codes 0..15).
template <typename S>
__device__ __forceinline__ void word_f(uint32_t u, float* f) {
  if constexpr (std::is_same_v<S, q8>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = byte_f(u, i);
  } else if constexpr (std::is_same_v<S, q4>) {
    const uint32_t lo = u & 0x0f0f0f0fu, hi = (u >> 4) & 0x0f0f0f0fu;  // even, odd values
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = byte_f(lo, i);
      f[2 * i + 1] = byte_f(hi, i);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t((u >> (16 * k)) & 0xffffu), __NV_E4M3);
      __half2 h2;
      memcpy(&h2, &h, 4);
      const float2 v = __half22float2(h2);  // e4m3 values are exact in f16 and f32
      f[2 * k] = v.x;
      f[2 * k + 1] = v.y;
    }
  }
}

// The 8 codes as floats (word_f of each word).
template <typename S>
__device__ __forceinline__ void codes_f(typename QTraits<S>::Codes8 c, float* f) {
  if constexpr (std::is_same_v<S, q4>) {
    word_f<S>(c, f);
  } else {
    word_f<S>(c.x, f);
    word_f<S>(c.y, f + 4);
  }
}

// The 8 values as attention reads them, exactly as kv_dequantize_row.
template <typename S>
__device__ __forceinline__ void dequant8(typename QTraits<S>::Codes8 c, uint32_t params, float* f) {
  codes_f<S>(c, f);
  if constexpr (QTraits<S>::kAffine) {
    const float s = half_lo(params), b = half_hi(params);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = fmaf(s, f[i], b);
  } else {
    const float s = __uint_as_float(params);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] *= s;
  }
}

__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Quantizes one row of D values x (shared or global memory, complete before
// the call) into codes (code_row bytes) and aux (aux_row bytes), shared or
// global; params_s: shared u32 [D / group] (at least 1) that ends holding the
// params words. Called by every thread of the block (blockDim.x a multiple of
// 32); ends synchronised. The same bytes as kv_quantize_row.
template <typename S>
__device__ void quantize_row_block(const float* x, int D, int group, uint8_t* codes, uint8_t* aux,
                                   uint32_t* params_s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  constexpr int kBits = QTraits<S>::kBits;
  if constexpr (QTraits<S>::kAffine) {
    const int G = D / group;
    for (int g = warp; g < G; g += nw) {
      float lo = INFINITY, hi = -INFINITY;
      bool finite = true;
      for (int d = g * group + lane; d < (g + 1) * group; d += 32) {
        finite = finite && kv_finite(x[d]);
        const float c = kv_clamp_f16_range(x[d]);
        lo = fminf(lo, c);
        hi = fmaxf(hi, c);
      }
      lo = warp_min(lo);
      hi = warp_max(hi);
      finite = __all_sync(0xffffffffu, finite);
      if (lane == 0) {
        const uint32_t w = kv_affine_word(kv_affine_params(lo, hi, kBits, finite));
        params_s[g] = w;
        reinterpret_cast<uint32_t*>(aux)[g] = w;
      }
    }
    __syncthreads();
    const int n = kBits == 8 ? D : D / 2;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      if constexpr (kBits == 8) {
        const uint32_t w = params_s[i / group];
        codes[i] = uint8_t(kv_affine_code(x[i], kv_affine_scale(w), kv_affine_bias(w), 8));
      } else {
        const uint32_t w = params_s[2 * i / group];
        const float s = kv_affine_scale(w), b = kv_affine_bias(w);
        codes[i] = uint8_t(kv_affine_code(x[2 * i], s, b, 4) | kv_affine_code(x[2 * i + 1], s, b, 4) << 4);
      }
    }
  } else {
    if (warp == 0) {
      float amax = 0.0f;
      bool finite = true;
      for (int d = lane; d < D; d += 32) {
        finite = finite && kv_finite(x[d]);
        amax = fmaxf(amax, fabsf(x[d]));
      }
      amax = warp_max(amax);
      finite = __all_sync(0xffffffffu, finite);
      if (lane == 0) {
        const float s = kv_fp8_scale(amax, finite);
        params_s[0] = __float_as_uint(s);
        *reinterpret_cast<float*>(aux) = s;
      }
    }
    __syncthreads();
    const float s = __uint_as_float(params_s[0]);
    for (int i = threadIdx.x; i < D; i += blockDim.x) codes[i] = kv_fp8_code(x[i], s);
  }
  __syncthreads();
}

}  // namespace kvgraph::cuda::detail
