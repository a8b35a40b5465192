#pragma once
// An error the server answers with an HTTP status and an OpenAI-shaped body:
//   {"error": {"message": "...", "type": "invalid_request_error", "code": "..."}}
// Request parsing, slot admission and the handlers throw it; the HTTP layer
// turns it into the response (server.cpp). Anything else that escapes a
// handler is a 500 with the exception's message.
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvgraph/error.h"

namespace kvgraph::server {

class ApiError : public Error {
 public:
  // type: OpenAI's error type ("invalid_request_error", "authentication_error",
  // "not_found_error", "server_error", "unavailable_error"); code: a short
  // machine-readable reason, e.g. "context_length_exceeded".
  ApiError(int status, std::string type, std::string code, const std::string& message)
      : Error(message), status_(status), type_(std::move(type)), code_(std::move(code)) {}

  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string type_, code_;
};

// The body for an error: {"error": {"message", "type", "code"}}.
inline std::string error_body(const std::string& message, const std::string& type, const std::string& code) {
  nlohmann::ordered_json j;
  j["error"] = {{"message", message}, {"type", type}, {"code", code}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// bad_request("max_tokens", "expected an integer >= 1, got {}", 0) throws a
// 400 invalid_request_error whose message names the field.
template <typename... Args>
[[noreturn]] inline void bad_request(const std::string& code, fmt::format_string<Args...> f, Args&&... args) {
  throw ApiError(400, "invalid_request_error", code, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kvgraph::server
