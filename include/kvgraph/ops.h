#pragma once
// The op set. One declaration per op; each backend implements it
// (src/ops/cpu/*.cpp, src/ops/cuda/*.cu) and a backend that lacks an op
// throws "[<op>] has no <device> implementation".
//
// Every op is submitted to a Stream: on the CPU it runs at once or is
// recorded as a closure; on CUDA it launches kernels (captured while
// recording). Ops never read per-token values from the host: positions and
// token ids come from step-state tensors on the device.
#include <cstdint>

#include "kvgraph/cache/sequence_cache.h"
#include "kvgraph/op_types.h"
#include "kvgraph/stream.h"
#include "kvgraph/tensor.h"
#include "kvgraph/weight.h"

namespace kvgraph::ops {

// out f32 [T, D] = table [V, D] rows at ids i32 [T], times `scale`.
void embedding(Stream& s, const Tensor& table, const Tensor& ids, Tensor& out, float scale);
// The same from a Weight table [V, D], plain or quantized (rows dequantised as gathered).
void embedding(Stream& s, const Weight& table, const Tensor& ids, Tensor& out, float scale);

// out f32 [rows, D] = x / rms(x) * w (or * (1 + w) when plus_one); x f32 [rows, D], w [D].
// out may alias x.
void rms_norm(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, float eps, bool plus_one);

// out f32 [T, N] = x f32 [T, K] @ w[N, K]^T (+ bias [N] when given).
void linear(Stream& s, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out);

// The same with fused prologue and epilogues (LinearOptions, op_types.h).
void linear(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, const LinearOptions& o);

// The same on a Weight [N, K], plain or affine-quantized (kvgraph/quant.h);
// a bias must then be in the scales' float type. Quantized products equal
// the plain product on the dequantised matrix (CPU: exactly the same BLAS
// calls on f32 panels; CUDA: the fused-dequant GEMV, or bf16 slabs for T > 1).
void linear(Stream& s, const Tensor& x, const Weight& w, Tensor& out, const LinearOptions& o);

// out f32 [rows, D] += rms_norm(x) * w (Gemma's post-norms on the residual stream).
void rms_norm_add(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, float eps, bool plus_one);

// In place, rotate-half (NeoX/HF) RoPE on x f32 [T, H, head_dim]; token t is
// at position pos[0] + t (pos: i32 [1], read when the op runs).
void rope(Stream& s, Tensor& x, const Tensor& pos, const Tensor& inv_freq);

// out f32 [T, F] = act(gate) * up.
void act_mul(Stream& s, const Tensor& gate, const Tensor& up, Tensor& out, Activation act);

// out = a + b (f32, same shape); out may alias a or b.
void add(Stream& s, const Tensor& a, const Tensor& b, Tensor& out);

// x = cap * tanh(x / cap), in place (f32).
void softcap(Stream& s, Tensor& x, float cap);

// Picks the next token from logits f32 [V] into token i32 [1]; -1 when a
// logit is NaN or +inf (nothing is marked seen then), so a broken model is
// caught with the token the host reads anyway, at no extra sync.
//   config: u8 [sizeof(SamplingParams)] on the device holding the settings,
//           read when the op runs (so one recorded step serves any settings).
//   banned: i32 [n] ids whose logits are masked (e.g. EOS with --ignore-eos).
//   seen:   u8 [V] tokens present so far (repetition penalty); updated with the
//           chosen token.
//   pos:    i32 [1] counter for the counter-based RNG (draw = f(seed, pos)).
void sample(Stream& s, const Tensor& logits, const Tensor& config, const Tensor& banned, int n_banned,
            Tensor& seen, const Tensor& pos, Tensor& token);

// Marks ids i32 [T] as seen (u8 [V]).
void mark_seen(Stream& s, const Tensor& ids, Tensor& seen);

// pos[0] += n: the last action of a step.
void advance(Stream& s, Tensor& pos, int n);

// update_and_attend: one layer's step of a sequence cache. Writes the step's
// k/v rows into the layer's pool (rounded to the storage dtype, or quantized:
// kvgraph/cache/kv_format.h), then attends
// every query over exactly the rows it may see (causal; a band for ring
// layers; GQA), from the pool, in f32. Designated-initialised:
//
//   ops::update_and_attend(s, {.cache = &cache, .step = step, .layer = l,
//                              .qkv = &qkv, .out = &attn, .scale = 0.125f});
//
// Shapes (f32): q [T, n_heads, head_dim], k/v [T, n_kv_heads, head_dim], or
// qkv [T, (n_heads + 2 n_kv_heads) * head_dim] packed per token as a fused
// QKV projection writes it ([q heads | k heads | v heads]); out
// [T, n_heads, head_dim].
struct AttendArgs {
  SequenceCache* cache = nullptr;
  CacheStep step;  // from cache->begin_step
  int layer = 0;
  const Tensor* q = nullptr;  // q, k and v ...
  const Tensor* k = nullptr;
  const Tensor* v = nullptr;
  const Tensor* qkv = nullptr;  // ... or packed
  Tensor* out = nullptr;
  float scale = 1.0f;    // applied to q.k
  float softcap = 0.0f;  // 0: none; else logits = softcap * tanh(logits / softcap)
  // Prologue on every q head and every new k head, before the write and the
  // products (the inputs are not modified): per-head RMSNorm when the weights
  // are given (f32 [head_dim]; Qwen3 and Gemma 3 q/k norms), then rotate-half
  // RoPE at the token's position when rope_inv_freq is (f32 [head_dim / 2]).
  const Tensor* q_norm = nullptr;
  const Tensor* k_norm = nullptr;
  float norm_eps = 1e-6f;
  bool norm_plus_one = false;
  const Tensor* rope_inv_freq = nullptr;
};
void update_and_attend(Stream& s, const AttendArgs& a);

// dst[0..n) = src[0..n) (same dtype, same device).
void copy(Stream& s, const Tensor& src, Tensor& dst);

// Fills an f32 or bf16 tensor with uniform values in [-scale, scale]
// (deterministic for a seed); used for synthetic benchmark weights.
void fill_random(Stream& s, Tensor& t, uint64_t seed, float scale);

// Copy bandwidth of the device in GB/s: (bytes read + bytes written) / time
// of a large buffer copy, best of several. The decode floor is measured in it.
double measure_copy_bandwidth_gbs(Device d);

}  // namespace kvgraph::ops
