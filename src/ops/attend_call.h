#pragma once
// One layer's update_and_attend, resolved to raw pointers: what the op front
// (src/ops/ops.cpp) hands to either backend after checking the arguments
// once. The CPU loop (ops/cpu/attention.cpp) and the CUDA kernels
// (ops/cuda/attention.cu, where it is cuda::AttentionParams) read this one
// struct; nothing is re-packed on the way.
#include <cstdint>

#include "kvgraph/cache/kv_format.h"
#include "kvgraph/cache/slots.h"
#include "kvgraph/dtype.h"

namespace kvgraph {
struct StepPlan;  // kvgraph/cache/plan.h (C++20; the .cu files are C++17)
}  // namespace kvgraph

namespace kvgraph::ops {

struct AttendCall {
  const float* q = nullptr;  // f32 [T, n_q_heads, head_dim]   token stride q_stride (0: dense)
  const float* k = nullptr;  // f32 [T, n_kv_heads, head_dim]  token stride k_stride
  const float* v = nullptr;  // f32 [T, n_kv_heads, head_dim]  token stride v_stride
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  // The layer's pools in their formats (kv_format.h): codes [n_kv_heads,
  // rule.pool, head_dim] of the plain dtype, or u8 [n_kv_heads, rule.pool,
  // code_bytes]; aux u8 [n_kv_heads, rule.pool, aux_bytes] (scales, biases)
  // for quantized formats, else null.
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  void* k_aux = nullptr;
  void* v_aux = nullptr;
  KvFormat k_format = KvType::BF16;
  KvFormat v_format = KvType::BF16;
  float* out = nullptr;      // f32 [T, n_q_heads, head_dim], dense
  const int32_t* pos = nullptr;  // i32 [1] on the device: position of token 0
  // CPU: the step's plan for this layer's policy, written by the step's plan
  // op when it runs (CUDA kernels derive slots from pos and rule instead).
  const StepPlan* plan = nullptr;
  SlotRule rule;             // window 0: flat (slot = position); else ring (slot = position % pool)
  int T = 1;
  int n_q_heads = 0, n_kv_heads = 0;  // n_kv_heads divides n_q_heads (GQA)
  int head_dim = 0;          // CUDA: power of two, 8..256
  float scale = 1.0f;        // applied to q.k
  float softcap = 0.0f;      // > 0: logits = softcap * tanh(logits / softcap), after scaling
  // Prologue applied to every q head and every new k head, in this order,
  // before the write and the products; q/k/v themselves are never modified.
  // Per-head RMSNorm (Qwen3, Gemma 3 q/k norms), when the weights are given:
  const float* q_norm = nullptr;   // f32 [head_dim] or null
  const float* k_norm = nullptr;   // f32 [head_dim] or null
  float norm_eps = 1e-6f;
  bool norm_plus_one = false;      // Gemma: * (1 + w)
  // Rotate-half RoPE at the token's position, when given:
  const float* rope_inv_freq = nullptr;  // f32 [head_dim / 2] or null
};

}  // namespace kvgraph::ops
