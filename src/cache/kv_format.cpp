#include "kvgraph/cache/kv_format.h"

#include <fmt/format.h>

namespace kvgraph {

std::string kv_format_name(KvFormat f) {
  switch (f.type) {
    case KvType::F32: return "f32";
    case KvType::BF16: return "bf16";
    case KvType::F16: return "f16";
    case KvType::Int8: return fmt::format("int8 g{}", f.group);
    case KvType::Int4: return fmt::format("int4 g{}", f.group);
    case KvType::Fp8: return "fp8";
    case KvType::Invalid: break;
  }
  return std::string(dtype_name(f.dtype));
}

std::string kv_storage_name(const KvStorage& s) {
  if (s.k == s.v) return kv_format_name(s.k);
  return fmt::format("k {}, v {}", kv_format_name(s.k), kv_format_name(s.v));
}

KvFormat parse_kv_format(std::string_view name, int32_t group) {
  if (name == "f32") return KvType::F32;
  if (name == "bf16") return KvType::BF16;
  if (name == "f16") return KvType::F16;
  if (name == "int8") return KvFormat{KvType::Int8, group};
  if (name == "int4") return KvFormat{KvType::Int4, group};
  if (name == "fp8") return KvType::Fp8;
  return KvType::Invalid;
}

std::string kv_format_problem(KvFormat f, int64_t head_dim) {
  switch (f.type) {
    case KvType::F32:
    case KvType::BF16:
    case KvType::F16: return {};
    case KvType::Int8:
    case KvType::Int4:
      if (f.group != 32 && f.group != 64)
        return fmt::format("{} needs a group of 32 or 64, got {}", f.type == KvType::Int8 ? "int8" : "int4", f.group);
      if (head_dim % f.group != 0)
        return fmt::format("group {} does not divide head_dim {}", f.group, head_dim);
      return {};
    case KvType::Fp8:
      if (head_dim % 16 != 0) return fmt::format("fp8 needs head_dim a multiple of 16, got {}", head_dim);
      return {};
    case KvType::Invalid: break;
  }
  return fmt::format("storage dtype {} is not supported (f32, bf16, f16, int8, int4, fp8)", dtype_name(f.dtype));
}

std::string kv_cuda_problem(const KvStorage& s) {
  if (s.k.type == s.v.type || (s.k.type == KvType::Int8 && s.v.type == KvType::Int4)) return {};
  return fmt::format("CUDA has no attention kernel for K {} with V {} (one format for both, or K int8 with V int4)",
                     kv_format_name(s.k), kv_format_name(s.v));
}

}  // namespace kvgraph
