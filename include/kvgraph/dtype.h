#pragma once
// Element types of tensors and cache storage, with bf16/f16 <-> f32 conversion
// usable from host and device code.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#ifdef __CUDACC__
#define KV_HD __host__ __device__ __forceinline__
#else
#define KV_HD inline
#endif

namespace kvgraph {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8, U32 };  // U32: packed quantized words

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::U32: return 4;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
    case DType::U32: return "u32";
  }
  return "?";
}

// bf16: upper 16 bits of an f32, rounded to nearest even (NaN kept quiet).
KV_HD float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
KV_HD uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// IEEE half <-> f32 (round to nearest even), written out so host and device agree.
KV_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) { man <<= 1; --exp; }
      man &= 0x3ffu;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}
KV_HD uint16_t f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (a < 0x38800000u) {  // f16 subnormal or zero: value = m * 2^-24
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14..24
    uint32_t res = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (res & 1u))) ++res;
    return static_cast<uint16_t>(sign | res);
  }
  uint32_t res = ((a >> 13) - ((127 - 15) << 10));
  uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (res & 1u))) ++res;
  return static_cast<uint16_t>(sign | res);
}

#ifndef __CUDACC__
// n values of `dt` at `src` (any alignment) widened to f32: the one
// bytes-to-f32 conversion, used by tensors and checkpoint loading. Every
// DType converts (integers exactly up to 2^24).
inline void widen_to_f32(const void* src, DType dt, size_t n, float* out) {
  const unsigned char* p = static_cast<const unsigned char*>(src);
  auto each = [&](auto tag, auto convert) {
    using T = decltype(tag);
    for (size_t i = 0; i < n; ++i) {
      T v;
      memcpy(&v, p + sizeof(T) * i, sizeof(T));
      out[i] = convert(v);
    }
  };
  switch (dt) {
    case DType::F32: if (n) memcpy(out, p, n * 4); return;
    case DType::BF16: return each(uint16_t{}, bf16_to_f32);
    case DType::F16: return each(uint16_t{}, f16_to_f32);
    case DType::I32: return each(int32_t{}, [](int32_t v) { return static_cast<float>(v); });
    case DType::I64: return each(int64_t{}, [](int64_t v) { return static_cast<float>(v); });
    case DType::U8: return each(uint8_t{}, [](uint8_t v) { return static_cast<float>(v); });
    case DType::U32: return each(uint32_t{}, [](uint32_t v) { return static_cast<float>(v); });
  }
}
#endif

}  // namespace kvgraph
