#pragma once
// Cache planning: integers only, no tensors. A policy says how a layer keeps
// its history; plan(position, T) says which physical rows a step writes and
// reads and which mask it needs. Layers that share a policy share the plan.
#include <array>
#include <cstdint>
#include <string>

#include "kvgraph/cache/slots.h"

namespace kvgraph {

// Full history up to `capacity` rows; slot = position.
struct Flat {
  int32_t capacity = 0;
};

// Sliding window of `window` keys; steps write at most `max_write` rows.
// The pool holds window + max_write - 1 rows so that a step never overwrites
// a row that one of its own queries still needs.
struct Ring {
  int32_t window = 0;
  int32_t max_write = 1;
};

class CachePolicy {
 public:
  CachePolicy() = default;
  CachePolicy(Flat f) : ring_(false), window_(0), pool_(f.capacity), max_write_(f.capacity) {}  // NOLINT
  CachePolicy(Ring r)  // NOLINT
      : ring_(true), window_(r.window), pool_(r.window + r.max_write - 1), max_write_(r.max_write) {}

  bool is_ring() const { return ring_; }
  int32_t window() const { return window_; }      // 0 for flat
  int32_t pool() const { return pool_; }          // rows allocated
  int32_t capacity() const { return is_ring() ? INT32_MAX : pool_; }  // max logical length
  int32_t max_write() const { return max_write_; }
  SlotRule rule() const { return SlotRule{pool_, window_}; }
  std::string describe() const;  // "flat(capacity=64)" / "ring(window=8, max_write=4, pool=11)"

  friend bool operator==(const CachePolicy&, const CachePolicy&) = default;

 private:
  bool ring_ = false;
  int32_t window_ = 0;
  int32_t pool_ = 0;
  int32_t max_write_ = 1;
};

// A contiguous physical range of `len` rows starting at `slot`, holding the
// logical positions [position, position + len).
struct SlotRun {
  int32_t slot = 0;
  int32_t len = 0;
  int32_t position = 0;
  friend bool operator==(const SlotRun&, const SlotRun&) = default;
};

enum class MaskKind : uint8_t {
  None,        // every read row is visible to every query (T == 1)
  Causal,      // query t sees positions <= position + t
  CausalBand,  // causal, and position > qpos - window
};

// What one step of T tokens at `position` does to a pool.
struct StepPlan {
  int32_t position = 0;
  int32_t T = 0;
  std::array<SlotRun, 2> write{};  // 1 or 2 runs (2 when a ring write wraps)
  int n_write = 0;
  std::array<SlotRun, 2> read{};   // logical order, oldest first; 1 or 2 runs
  int n_read = 0;
  MaskKind mask = MaskKind::None;
  // Logical range the step reads: [read_begin, position + T).
  int32_t read_begin = 0;
};

// Pure. Throws kvgraph::Error when the step does not fit: T < 1, T above the
// policy's max_write, or a flat pool that would overflow.
StepPlan plan(const CachePolicy& policy, int32_t position, int32_t T);

}  // namespace kvgraph
