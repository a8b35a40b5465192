#pragma once
// Slot arithmetic shared by the host planner, the CPU ops and the CUDA
// kernels: one source of truth for where a logical position lives in a pool
// and which positions a query may see. Integers only.
#include <cstdint>

#include "kvgraph/dtype.h"  // KV_HD

namespace kvgraph {

// What a kernel needs to know about one layer's pool.
//   window == 0: flat, slot = position, pool = capacity.
//   window  > 0: ring, slot = position mod pool, pool = window + max_write - 1.
struct SlotRule {
  int32_t pool = 0;
  int32_t window = 0;
};

KV_HD int32_t slot_of(SlotRule r, int32_t position) {
  return r.window > 0 ? position % r.pool : position;
}

// First logical position a query at `qpos` may attend to (inclusive); the
// last is qpos itself (causal).
KV_HD int32_t first_visible(SlotRule r, int32_t qpos) {
  if (r.window <= 0) return 0;
  int32_t lo = qpos - r.window + 1;
  return lo > 0 ? lo : 0;
}

// Oldest logical position still resident in the pool when `length` rows
// have been written (flat pools never evict).
KV_HD int32_t oldest_resident(SlotRule r, int32_t length) {
  if (r.window <= 0) return 0;
  int32_t lo = length - r.pool;
  return lo > 0 ? lo : 0;
}

}  // namespace kvgraph
