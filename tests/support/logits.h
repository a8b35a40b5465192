#pragma once
// Comparing logits: the largest absolute difference over the largest
// reference magnitude (a NaN anywhere makes it infinite).
#include <algorithm>
#include <cmath>
#include <vector>

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

}  // namespace kvgraph::testing
