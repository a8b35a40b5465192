#pragma once
// Logits of a prefill, and comparing logits: the largest absolute difference
// over the largest reference magnitude (a NaN anywhere makes it infinite).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kvgraph/model.h"
#include "kvgraph/session.h"

namespace kvgraph::testing {

inline double normalized_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / den;
}

// f32 [ids.size(), vocab]: every position's logits from prefilling `ids` into
// a fresh session of `m` with options `so` (capacity ids.size(), all_logits on).
inline std::vector<float> prefill_logits(std::shared_ptr<const Model> m, const std::vector<int32_t>& ids,
                                         SessionOptions so = {}) {
  so.capacity = static_cast<int32_t>(ids.size());
  so.all_logits = true;
  Session s(std::move(m), so);
  std::vector<float> out;
  s.prefill(ids, [&](int32_t, int32_t, const std::vector<float>& l) { out.insert(out.end(), l.begin(), l.end()); });
  return out;
}

}  // namespace kvgraph::testing
