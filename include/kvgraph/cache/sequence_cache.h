#pragma once
// The sequence cache: one K and one V pool per layer, allocated in full when
// the cache is created and never grown. It owns KV byte movement and the
// attention semantics of each layer behind one op, update_and_attend.
//
// A step is: begin_step(stream, pos, T) -> update_and_attend(layer, ...) for
// every layer -> commit(T). `pos` is the step state's device buffer holding
// the position of the step's first token; it is read when the recorded ops
// run, never baked in, so a recorded step replays correctly at any position.
#include <cstdint>
#include <string>
#include <vector>

#include "kvgraph/cache/plan.h"
#include "kvgraph/stream.h"
#include "kvgraph/tensor.h"

namespace kvgraph {

struct LayerSpec {
  CachePolicy policy;
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // must divide n_heads (GQA)
  int head_dim = 0;
};

struct CacheConfig {
  std::vector<LayerSpec> layers;
  DType storage = DType::F32;  // f32, bf16 or f16
  Device device = Device::CPU;
};

// Attention parameters owned by the caller (the model).
struct AttendParams {
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

class SequenceCache {
 public:
  // Validates the whole config and allocates every pool. Throws
  // kvgraph::Error naming the layer and field of the first problem.
  explicit SequenceCache(CacheConfig config);

  const CacheConfig& config() const { return config_; }
  int n_layers() const { return static_cast<int>(config_.layers.size()); }
  const CachePolicy& policy(int layer) const { return config_.layers.at(layer).policy; }

  // Logical length (host mirror of the committed position).
  int32_t length() const { return length_; }
  // Longest sequence the cache can hold (min flat capacity; INT32_MAX if all ring).
  int32_t capacity() const;
  // Largest step the cache accepts (min max_write over ring layers / capacity).
  int32_t max_write() const;
  size_t bytes() const;                 // all pools
  size_t bytes_per_token(int layer) const;  // K+V bytes of one row of one layer

  // Host-side check that a step of T tokens at `position` fits every layer;
  // throws before anything is written.
  void check_step(int32_t position, int32_t T) const;

  // Plans the step for every distinct policy (once per policy, shared by its
  // layers). `pos` is an i32 [1] tensor on the cache's device. On the CPU the
  // plan is computed when the op runs, from the value in `pos`, and a step
  // that would not fit throws there, before any layer writes.
  void begin_step(Stream& stream, const Tensor& pos, int32_t T);

  // Writes k/v for the step's T tokens into `layer`'s pool and attends q
  // over exactly the rows each query may see. Shapes (f32):
  //   q [T, n_heads, head_dim], k/v [T, n_kv_heads, head_dim],
  //   out [T, n_heads, head_dim].
  void update_and_attend(Stream& stream, int layer, const Tensor& q, const Tensor& k,
                         const Tensor& v, Tensor& out, AttendParams params);
  // The same with q, k and v packed in one row per token, as a fused QKV
  // projection writes them: qkv f32 [T, (n_heads + 2 * n_kv_heads) * head_dim]
  // = [q heads | k heads | v heads].
  void update_and_attend(Stream& stream, int layer, const Tensor& qkv, Tensor& out, AttendParams params);

  // Host bookkeeping after a step completed.
  void commit(int32_t T);
  // Forget everything after the first n tokens. Flat: any n <= length. Ring:
  // allowed while the rows a query at position n needs are still resident:
  // n >= written - max_write, where `written` is the longest length reached
  // since reset (a trim does not bring evicted rows back), or nothing was
  // evicted yet (written <= pool).
  void trim(int32_t n);
  void reset();

  // Raw pools (for tests and kernels): storage [n_kv_heads, pool, head_dim].
  const Tensor& k_pool(int layer) const { return k_.at(layer); }
  const Tensor& v_pool(int layer) const { return v_.at(layer); }

 private:
  CacheConfig config_;
  struct Rows {  // one of q/k/v: token t's heads start at p + t * stride
    const float* p;
    int64_t stride;
  };
  void attend(Stream& stream, int layer, Rows q, Rows k, Rows v, Tensor& out, AttendParams params);
  std::vector<Tensor> k_, v_;
  std::vector<CachePolicy> policies_;  // distinct policies
  std::vector<int> policy_of_layer_;   // index into policies_
  std::vector<StepPlan> plans_;        // CPU: per distinct policy, written by begin_step
  const int32_t* step_pos_ = nullptr;  // device pointer from begin_step
  int32_t step_T_ = 0;
  int32_t length_ = 0;
  int32_t written_ = 0;  // high-water mark since reset: decides what a ring evicted
};

}  // namespace kvgraph
