#pragma once
// Tool calls out of generated text, as it streams. Two styles:
//   - Hermes / Qwen: <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
//     any number, with ordinary text around them;
//   - Llama 3.1 JSON: the whole reply is one {"name": ..., "parameters": {...}}
//     object (after an optional <|python_tag|>).
// Text is fed in pieces as it is generated; what comes out is content that is
// final (safe to stream) and whole tool calls. Text that may still turn into
// a call is held: a tail that could start "<tool_call>", a call whose closing
// tag has not come, and a reply that starts with '{' (until the end). A call
// whose JSON does not parse is given back as content, never dropped.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvgraph::server {

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object, as OpenAI returns it
};

// One thing the parser lets out: final content text, or a whole call.
struct ToolEvent {
  bool is_call = false;
  std::string content;  // !is_call
  ToolCall call;        // is_call
};

class ToolCallParser {
 public:
  // The next generated text; returns what became final, in order (adjacent
  // content merged).
  std::vector<ToolEvent> feed(std::string_view text);
  // End of generation: anything held comes out (an unclosed call whose JSON
  // parses is a call; anything else is content, except whitespace between
  // or after calls, which is dropped).
  std::vector<ToolEvent> finish();

  int calls() const { return n_calls_; }

 private:
  // start: nothing but whitespace yet; text: ordinary text; in_call: inside
  // <tool_call>; after_call: whitespace since a call; json_reply: the reply
  // began with '{' (held to the end).
  enum class Mode { start, text, in_call, after_call, json_reply };
  void scan(std::vector<ToolEvent>& out);
  void content(std::vector<ToolEvent>& out, std::string_view text);
  bool try_call(std::string_view json_text, std::vector<ToolEvent>& out);  // false: not a call

  Mode mode_ = Mode::start;
  std::string buf_;  // held text
  int n_calls_ = 0;
};

// The tool call in a JSON object {"name": "...", "arguments" | "parameters": {...}}
// (also {"function": {...}} wrappers and "arguments" given as JSON text);
// false when `j` is not one.
bool tool_call_from_json(const nlohmann::json& j, ToolCall& call);

// A whole reply at once: its content (the content events joined) and calls.
struct ParsedReply {
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedReply parse_tool_calls(std::string_view text);

}  // namespace kvgraph::server
