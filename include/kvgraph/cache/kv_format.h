#pragma once
// Storage formats of a K or V pool, and the bytes one row of each takes.
//
// A row is one token of one KV head (head_dim values). Plain formats keep
// the values: f32, bf16, f16. Quantized formats keep codes, plus a small
// side row ("aux") per row in a separate pool of the same shape:
//
//   int8 / int4 (affine groups of `group` = 32 or 64 values along head_dim):
//     codes u8 [n_kv_heads, pool, head_dim * bits / 8]  (int4: value 2i in the
//           low nibble of byte i, 2i + 1 in the high one: MLX's packing of
//           codes into little-endian u32 words, read byte by byte)
//     aux   u8 [n_kv_heads, pool, head_dim / group * 4]: per group one f16
//           scale then one f16 bias; value = fmaf(scale, code, bias)
//   fp8 (e4m3, OCP "e4m3fn": no infinities, largest finite 448):
//     codes u8 [n_kv_heads, pool, head_dim]
//     aux   u8 [n_kv_heads, pool, 4]: one f32 scale per row (token, head);
//           value = e4m3(code) * scale
//
// The quantize and dequantize arithmetic is in kv_quant.h (host and device).
// Usable from the .cu files (C++17).
#include <cstdint>
#include <string>
#include <string_view>

#include "kvgraph/dtype.h"

namespace kvgraph {

enum class KvType : uint8_t { F32, BF16, F16, Int8, Int4, Fp8, Invalid };

struct KvFormat {
  KvType type = KvType::F32;
  int32_t group = 0;         // int8 / int4: values per (scale, bias) along head_dim (32 or 64); else 0
  DType dtype = DType::F32;  // element type of the codes pool: the dtype itself for plain formats, u8 otherwise

  constexpr KvFormat() = default;
  constexpr KvFormat(KvType t, int32_t g = 0)  // NOLINT: KvFormat{KvType::Int8, 64}
      : type(t), group(g), dtype(t == KvType::F32 ? DType::F32 : t == KvType::BF16 ? DType::BF16
                                                 : t == KvType::F16 ? DType::F16 : DType::U8) {}
  // The plain formats are dtypes (f32, bf16, f16); any other dtype makes an
  // Invalid format, which the cache refuses naming the dtype.
  constexpr KvFormat(DType d)  // NOLINT: implicit, so a DType still configures a cache
      : type(d == DType::F32 ? KvType::F32 : d == DType::BF16 ? KvType::BF16 : d == DType::F16 ? KvType::F16
                                                                                           : KvType::Invalid),
        group(0), dtype(d) {}

  constexpr bool quantized() const { return type == KvType::Int8 || type == KvType::Int4 || type == KvType::Fp8; }
  constexpr bool affine() const { return type == KvType::Int8 || type == KvType::Int4; }
  constexpr int bits() const { return type == KvType::Int4 ? 4 : type == KvType::Int8 || type == KvType::Fp8 ? 8 : 0; }

  // Bytes of one row of head_dim values in the codes pool and in the aux pool.
  constexpr int64_t code_bytes(int64_t head_dim) const {
    return type == KvType::Int4 ? head_dim / 2 : quantized() ? head_dim : head_dim * int64_t(dtype_size(dtype));
  }
  constexpr int64_t aux_bytes(int64_t head_dim) const {
    return affine() && group > 0 ? head_dim / group * 4 : type == KvType::Fp8 ? 4 : 0;
  }
  constexpr int64_t row_bytes(int64_t head_dim) const { return code_bytes(head_dim) + aux_bytes(head_dim); }

  constexpr bool operator==(const KvFormat& o) const { return type == o.type && group == o.group; }
  constexpr bool operator!=(const KvFormat& o) const { return !(*this == o); }
};

// The K and V formats of a layer (or of a whole cache).
struct KvStorage {
  KvFormat k, v;
  constexpr KvStorage() = default;
  constexpr KvStorage(KvFormat both) : k(both), v(both) {}  // NOLINT
  constexpr KvStorage(DType both) : k(both), v(both) {}     // NOLINT
  constexpr KvStorage(KvFormat k_, KvFormat v_) : k(k_), v(v_) {}
  constexpr bool operator==(const KvStorage& o) const { return k == o.k && v == o.v; }
  constexpr bool operator!=(const KvStorage& o) const { return !(*this == o); }
};

// "f32", "bf16", "f16", "int8 g64", "int4 g32", "fp8" (src/cache/kv_format.cpp).
std::string kv_format_name(KvFormat f);
// "int8 g64" when K and V agree, else "k int8 g64, v bf16".
std::string kv_storage_name(const KvStorage& s);
// The format named f32 | bf16 | f16 | int8 | int4 | fp8 (the affine ones in
// groups of `group`); Invalid for any other name.
KvFormat parse_kv_format(std::string_view name, int32_t group);
// Empty when `f` can store rows of `head_dim` values, else why not (one
// clause, e.g. "group 64 does not divide head_dim 96"): a supported type, a
// group of 32 or 64 that divides head_dim for int8/int4 (so int4 rows are
// whole bytes), head_dim a multiple of 16 for fp8.
std::string kv_format_problem(KvFormat f, int64_t head_dim);
// Empty when the CUDA attention kernels take this K/V pair (one format for
// both, or K int8 with V int4), else why not.
std::string kv_cuda_problem(const KvStorage& s);

}  // namespace kvgraph
