#pragma once
// CPU reference loops behind the op set (f32 activations, f32 weights).
#include <cstdint>

#include "kvgraph/op_types.h"

namespace kvgraph::cpu {

void embedding(const float* table, int64_t V, const int32_t* ids, int T, int D, float scale, float* out);
void rms_norm(const float* x, const float* w, float* out, int64_t rows, int D, float eps, bool plus_one);
// Steps of at most this many tokens (decode, speculative verify, short
// prefill chunks) multiply through rows_product; longer ones through BLAS.
constexpr int kRowsMaxT = 16;
// out[t * ldo + n] = dot(x [T, K] row t, w [N, K] row n) for t < T, n < N, each
// by a chain of operations that does not depend on T (or on N): row t of a
// T-token product is bitwise the product of that row alone. rows_product.cpp.
void rows_product(const float* x, int T, const float* w, int N, int K, float* out, int64_t ldo);
// out [T, N] = x [T, K] @ w [N, K]^T + bias (rows_product up to kRowsMaxT tokens, else BLAS)
void linear(const float* x, const float* w, const float* bias, float* out, int T, int N, int K);
// The same with bf16 weights (and bias, when given): widened to f32 a panel of
// rows at a time (exact), so a bf16 checkpoint stays bf16 in memory.
void linear_bf16(const float* x, const uint16_t* w, const uint16_t* bias, float* out, int T, int N, int K);
// Affine-quantized weights (kvgraph/quant.h): words u32 [N, K * bits / 32],
// scales and biases [N, K / group] in f32 or bf16 (scales_bf16), the bias of
// the product [N] (or null) in the same type. Rows are dequantised a panel at
// a time to f32, each value affine_value(s, q, b), for the same BLAS calls as
// linear(): the result is what linear() gives on the dequantised matrix.
struct AffineRows {
  const uint32_t* words = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  bool scales_bf16 = false;
  int bits = 0, group = 0;
  // Row n (of K values) as f32.
  void dequantize_row(int64_t n, int K, float* out) const;
};
void linear_affine(const float* x, const AffineRows& w, const void* bias, float* out, int T, int N, int K);
void embedding_affine(const AffineRows& table, int64_t V, const int32_t* ids, int T, int D, float scale, float* out);
void embedding_bf16(const uint16_t* table, int64_t V, const int32_t* ids, int T, int D, float scale, float* out);
void rope(float* x, int32_t pos0, const float* inv_freq, int T, int H, int D);  // x [T, H, D] in place
void act_mul(const float* gate, const float* up, float* out, int64_t n, Activation act);
void add(const float* a, const float* b, float* out, int64_t n);
void softcap(float* x, int64_t n, float cap);  // in place, elementwise kvgraph::softcap
// -1 when a logit (after penalty and bans) is NaN or +inf.
int32_t sample(const float* logits, int V, const ops::SamplingParams& p, const int32_t* banned, int n_banned,
               const uint8_t* seen, int32_t pos);

}  // namespace kvgraph::cpu
