#include "server/tool_calls.h"

#include <stdexcept>

namespace kvgraph::server {

namespace {

using nlohmann::json;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr int kMaxDepth = 64;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t first_non_space(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

std::string_view trim(std::string_view s) {
  s.remove_prefix(first_non_space(s));
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Whether s is a proper, non-empty prefix of tag.
bool proper_prefix_of(std::string_view s, std::string_view tag) {
  return !s.empty() && s.size() < tag.size() && tag.substr(0, s.size()) == s;
}

// The length of the longest tail of s that is a proper prefix of tag (text
// that may become the tag with the next piece).
size_t tail_prefix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

// JSON from generated text: null when it does not parse (or nests too deep).
json parse_json(std::string_view text) {
  try {
    return json::parse(text, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxDepth) throw std::length_error("too deep");
      return true;
    });
  } catch (const std::exception&) {
    return json();
  }
}

}  // namespace

bool tool_call_from_json(const json& j, ToolCall& call) {
  if (!j.is_object()) return false;
  const json* fn = &j;
  if (auto it = j.find("function"); it != j.end() && it->is_object()) fn = &*it;
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string() || name->get<std::string>().empty()) return false;
  auto args = fn->find("arguments");
  if (args == fn->end()) args = fn->find("parameters");
  if (args == fn->end()) return false;
  if (args->is_string()) {
    json parsed = parse_json(args->get<std::string>());
    if (!parsed.is_object()) return false;
    call.arguments = parsed.dump();
  } else if (args->is_object()) {
    call.arguments = args->dump();
  } else {
    return false;
  }
  call.name = name->get<std::string>();
  return true;
}

void ToolCallParser::content(std::vector<ToolEvent>& out, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && !out.back().is_call)
    out.back().content += text;
  else
    out.push_back({.is_call = false, .content = std::string(text), .call = {}});
}

bool ToolCallParser::try_call(std::string_view json_text, std::vector<ToolEvent>& out) {
  ToolCall call;
  if (!tool_call_from_json(parse_json(trim(json_text)), call)) return false;
  out.push_back({.is_call = true, .content = {}, .call = std::move(call)});
  ++n_calls_;
  return true;
}

void ToolCallParser::scan(std::vector<ToolEvent>& out) {
  while (true) {
    switch (mode_) {
      case Mode::start:
      case Mode::after_call: {
        const size_t i = first_non_space(buf_);
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.empty()) return;  // whitespace so far: it may precede a call
        if (rest.substr(0, kOpen.size()) == kOpen) {
          buf_.erase(0, i + kOpen.size());  // whitespace before a call is dropped
          mode_ = Mode::in_call;
          continue;
        }
        if (proper_prefix_of(rest, kOpen)) return;
        if (mode_ == Mode::start) {
          if (rest.substr(0, kPythonTag.size()) == kPythonTag) {
            buf_.erase(0, i + kPythonTag.size());
            continue;
          }
          if (proper_prefix_of(rest, kPythonTag)) return;
          if (rest[0] == '{') {
            mode_ = Mode::json_reply;
            return;
          }
        }
        mode_ = Mode::text;
        continue;
      }
      case Mode::text: {
        const size_t at = buf_.find(kOpen);
        if (at != std::string::npos) {
          content(out, std::string_view(buf_).substr(0, at));
          buf_.erase(0, at + kOpen.size());
          mode_ = Mode::in_call;
          continue;
        }
        const size_t keep = tail_prefix(buf_, kOpen);
        content(out, std::string_view(buf_).substr(0, buf_.size() - keep));
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case Mode::in_call: {
        const size_t at = buf_.find(kClose);
        if (at == std::string::npos) return;
        const std::string_view body = std::string_view(buf_).substr(0, at);
        if (try_call(body, out)) {
          mode_ = Mode::after_call;
        } else {
          content(out, std::string(kOpen) + std::string(body) + std::string(kClose));
          mode_ = Mode::text;
        }
        buf_.erase(0, at + kClose.size());
        continue;
      }
      case Mode::json_reply:
        return;  // decided at finish()
    }
  }
}

std::vector<ToolEvent> ToolCallParser::feed(std::string_view text) {
  std::vector<ToolEvent> out;
  buf_.append(text);
  scan(out);
  return out;
}

std::vector<ToolEvent> ToolCallParser::finish() {
  std::vector<ToolEvent> out;
  switch (mode_) {
    case Mode::start:
    case Mode::text:
      content(out, buf_);
      break;
    case Mode::after_call:
      if (first_non_space(buf_) < buf_.size()) content(out, buf_);  // an unfinished "<tool_" after a call
      break;
    case Mode::in_call:
      if (!try_call(buf_, out)) content(out, std::string(kOpen) + buf_);
      break;
    case Mode::json_reply:
      if (!try_call(buf_, out)) content(out, buf_);
      break;
  }
  buf_.clear();
  mode_ = Mode::text;
  return out;
}

ParsedReply parse_tool_calls(std::string_view text) {
  ToolCallParser p;
  ParsedReply r;
  auto take = [&r](std::vector<ToolEvent> events) {
    for (auto& e : events) {
      if (e.is_call)
        r.calls.push_back(std::move(e.call));
      else
        r.content += e.content;
    }
  };
  take(p.feed(text));
  take(p.finish());
  return r;
}

}  // namespace kvgraph::server
