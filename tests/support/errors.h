#pragma once
// The message of the kvgraph::Error a call throws, for tests of error text.
#include <string>
#include <utility>

#include "kvgraph/error.h"

namespace kvgraph::testing {

// The message of the kvgraph::Error that `f` throws ("" if none; any other
// exception goes through).
template <typename F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace kvgraph::testing
