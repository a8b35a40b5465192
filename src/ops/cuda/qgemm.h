#pragma once
// Prefill on affine-quantized weights on the tensor cores, the dequantisation
// fused into the weight stream (qgemm.cu). linear() takes it for
// kMaxGemvTokens < T <= LinearParams::qmma_tokens where it fits; other steps
// dequantise slabs of rows to bf16 for cuBLAS.
#include <cstddef>
#include <cstdint>

#include "ops/cuda/kernels.h"

namespace kvgraph::cuda {

constexpr int kQGemmMaxTokens = 512;  // the longest step qgemm takes

// Whether p (quantized, T > kMaxGemvTokens) runs on the fused kernel: T up to
// kQGemmMaxTokens, K a multiple of 64 (whole stages of 64 values).
bool qgemm_fits(const LinearParams& p);

// Bytes of f32 scratch qgemm needs for p (partial sums of a split K; 0 when
// K is not split).
size_t qgemm_scratch_bytes(const LinearParams& p);

// out = x w^T with p's epilogue (bias, residual or gate). x_bf16 [T, K] is
// the product's x after the norm prologue, rounded to bf16; the weights are
// dequantised exactly as the slab path does (bf16 of fmaf(scale, q, bias)),
// products accumulate in f32 on the tensor cores. The split of K and the
// order of every sum depend only on the shapes: deterministic.
void qgemm(const LinearParams& p, const uint16_t* x_bf16, float* scratch, Launch stream);

}  // namespace kvgraph::cuda
