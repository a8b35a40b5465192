#pragma once
// Tensor-core fragments: mma.sync m16n8k16 with f32 accumulation over bf16 or
// f16 operands, and ldmatrix. The attention kernels (flash prefill, decode on
// the tensor cores) and the quantized GEMM (qgemm.cu) share them. Only
// included by .cu files.
#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/cuda/common.cuh"

namespace kvgraph::cuda {

// Fragment layouts (PTX ISA, m16n8k16, g = lane / 4, c = lane % 4):
//   A (16 x 16, row): a[0] = (g, 2c..2c+1), a[1] = (g + 8, 2c..), a[2] = (g, 2c + 8..), a[3] = (g + 8, 2c + 8..)
//   B (16 x 8, col):  b0 = (k 2c..2c+1, n g), b1 = (k 2c + 8.., n g)
//   C (16 x 8):       c[0..1] = (g, 2c..2c+1), c[2..3] = (g + 8, 2c..2c+1)
// each register holding the lower k (or n) in its low half.
template <typename S> struct Mma;
template <> struct Mma<detail::bf16> {
  // (lo, hi) -> two rounded values in one register, lo in the low half.
  static __device__ __forceinline__ uint32_t pack(float lo, float hi, float& sum) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    sum += __low2float(h) + __high2float(h);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
  }
  static __device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<detail::f16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi, float& sum) {
    const __half2 h = __floats2half2_rn(lo, hi);
    sum += __low2float(h) + __high2float(h);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
  }
  static __device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

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
