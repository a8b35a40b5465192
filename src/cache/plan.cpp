#include "kvgraph/cache/plan.h"

#include <fmt/format.h>

#include "kvgraph/error.h"

namespace kvgraph {

std::string CachePolicy::describe() const {
  if (is_ring()) return fmt::format("ring(window={}, max_write={}, pool={})", window_, max_write_, pool_);
  return fmt::format("flat(capacity={})", pool_);
}

namespace {

// Splits the logical range [begin, end) into physical runs of the pool.
int split_runs(SlotRule rule, int32_t begin, int32_t end, std::array<SlotRun, 2>& out) {
  if (end <= begin) return 0;
  int32_t len = end - begin;
  int32_t slot = slot_of(rule, begin);
  if (rule.window <= 0 || slot + len <= rule.pool) {
    out[0] = SlotRun{slot, len, begin};
    return 1;
  }
  int32_t first = rule.pool - slot;
  out[0] = SlotRun{slot, first, begin};
  out[1] = SlotRun{0, len - first, begin + first};
  return 2;
}

}  // namespace

StepPlan plan(const CachePolicy& policy, int32_t position, int32_t T) {
  if (T < 1) fail("cache_plan", "{}: step of {} tokens (must be at least 1)", policy.describe(), T);
  if (position < 0) fail("cache_plan", "{}: negative position {}", policy.describe(), position);
  if (T > policy.max_write())
    fail("cache_plan", "{}: step of {} tokens exceeds max_write {}", policy.describe(), T,
         policy.max_write());
  if (!policy.is_ring() && static_cast<int64_t>(position) + T > policy.capacity())
    fail("cache_plan", "{}: step of {} tokens at position {} would overflow capacity {}",
         policy.describe(), T, position, policy.capacity());

  StepPlan p;
  p.position = position;
  p.T = T;
  SlotRule rule = policy.rule();
  p.n_write = split_runs(rule, position, position + T, p.write);
  p.read_begin = first_visible(rule, position);
  p.n_read = split_runs(rule, p.read_begin, position + T, p.read);
  if (T == 1)
    p.mask = MaskKind::None;
  else
    p.mask = policy.is_ring() ? MaskKind::CausalBand : MaskKind::Causal;
  return p;
}

}  // namespace kvgraph
