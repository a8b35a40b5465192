// Range checks of ops::SamplingParams (declared in kvgraph/op_types.h). They
// live outside the op set: the ops trust their settings, and every caller
// (Session, the CLI) checks them here once, on the host.
#include <cmath>

#include <fmt/format.h>

#include "kvgraph/error.h"
#include "kvgraph/op_types.h"

namespace kvgraph::ops {

std::optional<SamplingIssue> check(const SamplingParams& p) {
  // Written so that NaN fails every test (each comparison is false for NaN).
  if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f))
    return SamplingIssue{"temperature", fmt::format("{}", p.temperature), "a finite number >= 0 (0: greedy)"};
  if (p.top_k < 0) return SamplingIssue{"top_k", fmt::format("{}", p.top_k), "an integer >= 0 (0: off)"};
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return SamplingIssue{"top_p", fmt::format("{}", p.top_p), "a number in (0, 1]"};
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f))
    return SamplingIssue{"repetition_penalty", fmt::format("{}", p.repetition_penalty),
                         "a finite number > 0 (1: off)"};
  return std::nullopt;
}

void validate(const SamplingParams& p) {
  if (auto issue = check(p)) fail("sampling", "{} {}: expected {}", issue->field, issue->value, issue->expected);
}

}  // namespace kvgraph::ops
