#pragma once
// Tensor-core fragments: mma.sync m16n8k16 with f32 accumulation over bf16 or
// f16 operands, and ldmatrix. The attention kernels (flash prefill, decode on
// the tensor cores) and the quantized GEMM (qgemm.cu) share them. Only
// included by .cu files.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/cuda/common.cuh"

namespace kvgraph::cuda {

// Fragment layouts (PTX ISA, m16n8k16, g = lane / 4, c = lane % 4):
//   A (16 x 16, row): a[0] = (g, 2c..2c+1), a[1] = (g + 8, 2c..), a[2] = (g, 2c + 8..), a[3] = (g + 8, 2c + 8..)
//   B (16 x 8, col):  b0 = (k 2c..2c+1, n g), b1 = (k 2c + 8.., n g)
//   C (16 x 8):       c[0..1] = (g, 2c..2c+1), c[2..3] = (g + 8, 2c..2c+1)
// each register holding the lower k (or n) in its low half.
// Two values rounded to S's pair type (round to nearest even).
__device__ __forceinline__ __nv_bfloat162 round_pair(detail::bf16, float lo, float hi) {
  return __floats2bfloat162_rn(lo, hi);
}
__device__ __forceinline__ __half2 round_pair(detail::f16, float lo, float hi) { return __floats2half2_rn(lo, hi); }

// D = A B + D on S operands (T: S's PTX type name), f32 accumulators.
#define KVGRAPH_MMA_16816(T, c, a, b0, b1)                                                              \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
               "{%8,%9}, {%0,%1,%2,%3};\n"                                                             \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                        \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

// S = detail::bf16 or detail::f16.
template <typename S>
struct Mma {
  static_assert(std::is_same_v<S, detail::bf16> || std::is_same_v<S, detail::f16>, "mma.sync takes bf16 or f16");
  // (lo, hi) -> two rounded values in one register, lo in the low half; sum
  // gains the rounded values.
  static __device__ __forceinline__ uint32_t pack(float lo, float hi, float& sum) {
    const auto h = round_pair(S{}, lo, hi);
    sum += __low2float(h) + __high2float(h);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
  }
  static __device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same_v<S, detail::bf16>)
      KVGRAPH_MMA_16816("bf16", c, a, b0, b1);
    else
      KVGRAPH_MMA_16816("f16", c, a, b0, b1);
  }
};
#undef KVGRAPH_MMA_16816

// hi + lo of (x0, x1) in the storage type: two registers of A fragments
// (the rounded values, then what the rounding lost, rounded), so an operand
// carries ~16 bits. The decode attention splits q and P, the tensor-core
// GEMV x.
template <typename S>
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  float unused = 0.f;
  hi = Mma<S>::pack(x0, x1, unused);
  S h[2];
  memcpy(h, &hi, 4);
  lo = Mma<S>::pack(x0 - detail::to_f32(h[0]), x1 - detail::to_f32(h[1]), unused);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

}  // namespace kvgraph::cuda
