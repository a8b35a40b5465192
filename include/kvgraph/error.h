#pragma once
// One error channel: exceptions whose message starts with the component in
// brackets, e.g. "[sequence_cache] layer 3: window 4096 exceeds capacity 2048".
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace kvgraph {

// Thrown for bad input (user files, configs, arguments).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The cache has no room for what was asked; nothing was written. Callers
// that treat the cache limit as a stop (generation ends with reason
// "length") catch this one.
class CacheFull : public Error {
 public:
  using Error::Error;
};

// fail("sequence_cache", "layer {}: bad window {}", l, w) throws
// Error("[sequence_cache] layer 3: bad window 0").
template <typename... Args>
[[noreturn]] inline void fail(std::string_view component, fmt::format_string<Args...> f,
                              Args&&... args) {
  throw Error(fmt::format("[{}] {}", component, fmt::format(f, std::forward<Args>(args)...)));
}

}  // namespace kvgraph
