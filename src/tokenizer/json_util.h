#pragma once
// Field access on tokenizer.json with errors that name the field:
// "[tokenizer] tokenizer.json: model: \"vocab\" must be an object".
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvgraph/error.h"

namespace kvgraph::tok {

using nlohmann::json;

[[noreturn]] inline void bad_json(std::string_view where, std::string_view msg) {
  fail("tokenizer", "tokenizer.json: {}: {}", where, msg);
}

// The member `key`, or nullptr when absent or null.
inline const json* opt_field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

inline const json& need_field(const json& obj, const char* key, std::string_view where) {
  const json* v = opt_field(obj, key);
  if (!v) bad_json(where, fmt::format("missing \"{}\"", key));
  return *v;
}

inline std::string need_string(const json& obj, const char* key, std::string_view where) {
  const json& v = need_field(obj, key, where);
  if (!v.is_string()) bad_json(where, fmt::format("\"{}\" must be a string", key));
  return v.get<std::string>();
}

inline std::string opt_string(const json& obj, const char* key, std::string_view dflt, std::string_view where) {
  const json* v = opt_field(obj, key);
  if (!v) return std::string(dflt);
  if (!v->is_string()) bad_json(where, fmt::format("\"{}\" must be a string", key));
  return v->get<std::string>();
}

inline bool opt_bool(const json& obj, const char* key, bool dflt, std::string_view where) {
  const json* v = opt_field(obj, key);
  if (!v) return dflt;
  if (!v->is_boolean()) bad_json(where, fmt::format("\"{}\" must be true or false", key));
  return v->get<bool>();
}

inline int64_t opt_int(const json& obj, const char* key, int64_t dflt, std::string_view where) {
  const json* v = opt_field(obj, key);
  if (!v) return dflt;
  if (!v->is_number_integer()) bad_json(where, fmt::format("\"{}\" must be an integer", key));
  return v->get<int64_t>();
}

inline const json& need_array(const json& obj, const char* key, std::string_view where) {
  const json& v = need_field(obj, key, where);
  if (!v.is_array()) bad_json(where, fmt::format("\"{}\" must be an array", key));
  return v;
}

// Ids index a token table of (largest id + 1) entries, so they are capped: an
// id near 2^31 overflowed that size (UB), and one sparse id of 2e9 asked for a
// 64 GB table. Real vocabularies stay under 2^20.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// A token id from JSON: an integer in [0, kMaxTokenId].
inline int32_t as_token_id(const json& v, std::string_view where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0) {
    bad_json(where, fmt::format("{} is not a valid token id", v.dump()));
  }
  if (v.get<int64_t>() > kMaxTokenId) {
    bad_json(where, fmt::format("token id {} is larger than the limit {}", v.dump(), kMaxTokenId));
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

// "type" of a component object.
inline std::string type_of(const json& obj, std::string_view where) {
  if (!obj.is_object()) bad_json(where, "must be an object");
  return need_string(obj, "type", where);
}

[[noreturn]] inline void unsupported_type(std::string_view where, std::string_view type, std::string_view supported) {
  fail("tokenizer", "tokenizer.json: {} type \"{}\" is not supported (supported: {})", where, type, supported);
}

}  // namespace kvgraph::tok
