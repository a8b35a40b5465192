#pragma once
// The sequence cache: one K and one V pool per layer, allocated in full when
// the cache is created and never grown. It owns KV byte movement and the
// attention semantics of each layer behind one op, update_and_attend.
//
// A step is: step = begin_step(stream, pos, T) -> ops::update_and_attend
// (include/kvgraph/ops.h) for every layer, given the step -> commit(step). `pos` is the step state's device buffer holding
// the position of the step's first token; it is read when the recorded ops
// run, never baked in, so a recorded step replays correctly at any position.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvgraph/cache/kv_format.h"
#include "kvgraph/cache/plan.h"
#include "kvgraph/stream.h"
#include "kvgraph/tensor.h"

namespace kvgraph {

struct LayerSpec {
  CachePolicy policy;
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // must divide n_heads (GQA)
  int head_dim = 0;
  std::optional<KvStorage> storage = std::nullopt;  // this layer's K and V formats; unset: CacheConfig::storage
};

struct CacheConfig {
  std::vector<LayerSpec> layers;
  // K and V formats of every layer without its own (kv_format.h): f32, bf16,
  // f16, int8 / int4 affine groups, fp8; a DType sets both K and V.
  KvStorage storage = DType::F32;
  Device device = Device::CPU;
};

// One step of a cache, from begin_step to commit: an explicit value handed
// to every update_and_attend of the step (the cache keeps no hidden "current
// step"). Valid while the cache lives.
struct CacheStep {
  const int32_t* pos = nullptr;     // i32 [1] on the cache's device: position of the step's first token
  int32_t T = 0;                    // tokens in the step
  const StepPlan* plans = nullptr;  // CPU: a plan per distinct policy, written when the step's plan op runs
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
  // The K and V formats of a layer.
  const KvStorage& storage(int layer) const { return storage_.at(layer); }
  size_t bytes() const;                 // all pools (codes and their scales)
  size_t bytes_per_token(int layer) const;  // K+V bytes of one token of one layer, all KV heads, scales included

  // The one room check: throws CacheFull, before anything is written, when
  // n more tokens do not fit after the committed length.
  void reserve(int64_t n) const;

  // Starts a step of T tokens (1 <= T <= max_write(); throws otherwise).
  // `pos` is an i32 [1] step-state tensor on the cache's device holding the
  // position of the step's first token; it is read when the recorded ops
  // run, never baked in. On the CPU this submits the op that plans the step
  // once per distinct policy (layers share it); on CUDA the kernels derive
  // their slots from pos themselves. Then ops::update_and_attend for each
  // layer, then commit.
  CacheStep begin_step(Stream& stream, const Tensor& pos, int32_t T);

  // Host bookkeeping after a step completed (checks the room again).
  void commit(const CacheStep& step);
  // Forget everything after the first n tokens. Flat: any n <= length. Ring:
  // allowed while the rows a query at position n needs are still resident:
  // n >= written - max_write, where `written` is the longest length reached
  // since reset (a trim does not bring evicted rows back), or nothing was
  // evicted yet (written <= pool).
  void trim(int32_t n);
  // Whether trim(n) would succeed (0 <= n <= length and every ring layer
  // still holds the rows a query at n needs). With `written`, as if the
  // high-water mark were that.
  bool can_trim(int32_t n) const { return can_trim(n, written_); }
  bool can_trim(int32_t n, int32_t written) const;
  int32_t written() const { return written_; }
  // A step that failed after it began may have written rows up to position
  // `end` (exclusive) without committing them: counting them as written keeps
  // the trim rule honest about what a ring overwrote. The logical content
  // (rows [0, length) that any query may see) is unchanged.
  void note_written(int32_t end) { written_ = std::max(written_, end); }
  void reset();

  // Deep copy of another cache's rows and bookkeeping (same config), queued
  // on `stream` (device copies through ops::copy).
  void copy_from(Stream& stream, const SequenceCache& other);
  // Copies of the ring layers' pools (small: window + max_write - 1 rows),
  // taken before a step that could not be rolled back otherwise, and put
  // back by restore_rings. Flat layers are not copied: a rollback never
  // needs their rows past the kept length.
  struct RingSnapshot {
    std::vector<Tensor> k, v, k_aux, v_aux;  // per layer; undefined for flat layers (and aux of plain formats)
    int32_t length = 0, written = 0;
  };
  void snapshot_rings(Stream& stream, RingSnapshot& snap) const;
  void restore_rings(Stream& stream, const RingSnapshot& snap);

  // Serialisation of one layer's resident rows as stored: flat layers the
  // positions [0, length) of each KV head, ring layers the whole pool; K
  // codes, K aux (quantized formats), V codes, V aux, each head after head.
  // layer_state_bytes says how many bytes that is now.
  size_t layer_state_bytes(int layer) const;
  void export_layer(int layer, std::byte* out) const;
  // The inverse, for a cache whose length and written mark are then set by
  // set_extent (import first, so a throw leaves the bookkeeping alone).
  // `from_flat`: the rows are a flat layer's [0, length) and this layer is a
  // ring: it keeps the positions its pool can hold, each at its slot.
  void import_layer(int layer, const std::byte* in, int32_t length, bool from_flat = false);
  // Sets the committed length and high-water mark after an import.
  void set_extent(int32_t length, int32_t written);

  // Which distinct policy (index into a CacheStep's plans) a layer uses.
  int policy_index(int layer) const { return policy_of_layer_.at(layer); }
  // Raw pools (for the op backends and tests), kv_format.h: the codes,
  // dtype [n_kv_heads, pool, head_dim] for plain formats, u8 [n_kv_heads,
  // pool, code_bytes] for quantized ones; their aux (scales, biases), u8
  // [n_kv_heads, pool, aux_bytes], undefined for plain formats.
  const Tensor& k_pool(int layer) const { return k_.at(layer); }
  const Tensor& v_pool(int layer) const { return v_.at(layer); }
  const Tensor& k_aux(int layer) const { return k_aux_.at(layer); }
  const Tensor& v_aux(int layer) const { return v_aux_.at(layer); }

 private:
  // The pools of a layer in serialisation order: K codes, K aux, V codes, V aux (defined ones).
  std::vector<const Tensor*> layer_pools(int layer) const;

  CacheConfig config_;
  std::vector<KvStorage> storage_;     // per layer
  std::vector<Tensor> k_, v_;          // codes
  std::vector<Tensor> k_aux_, v_aux_;  // scales (and biases); undefined for plain formats
  std::vector<CachePolicy> policies_;  // distinct policies
  std::vector<int> policy_of_layer_;   // index into policies_
  std::vector<StepPlan> plans_;        // CPU: per distinct policy, written by the step's plan op
  int32_t length_ = 0;
  int32_t written_ = 0;  // high-water mark since reset: decides what a ring evicted
};

}  // namespace kvgraph
