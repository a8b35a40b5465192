#pragma once
// CPU reference of the cache's update_and_attend for one layer.
#include <cstdint>

#include "kvgraph/cache/plan.h"
#include "kvgraph/dtype.h"

namespace kvgraph::cpu {

struct AttentionArgs {
  const StepPlan* plan;  // written by the step's plan op
  SlotRule rule;
  DType storage;
  void* k_pool;          // storage [n_kv_heads, pool, head_dim]
  void* v_pool;          // storage [n_kv_heads, pool, head_dim]
  const float* q;        // f32 [T, n_heads, head_dim]
  const float* k;        // f32 [T, n_kv_heads, head_dim]
  const float* v;        // f32 [T, n_kv_heads, head_dim]
  float* out;            // f32 [T, n_heads, head_dim]
  int n_heads, n_kv_heads, head_dim;
  float scale, softcap;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;  // elements between tokens of q/k/v; 0: dense
  // Prologue on q heads and new k heads (inputs untouched): per-head RMSNorm
  // when the weights are given, then RoPE at the token's position.
  const float* q_norm = nullptr;   // f32 [head_dim] or null
  const float* k_norm = nullptr;
  float norm_eps = 1e-6f;
  bool norm_plus_one = false;
  const float* inv_freq = nullptr;  // f32 [head_dim / 2] or null
};

// Writes the plan's T rows, then attends every query over the rows it may
// see, in logical order, accumulating in f32 from storage-rounded K/V.
void update_and_attend(const AttentionArgs& a);

}  // namespace kvgraph::cpu
