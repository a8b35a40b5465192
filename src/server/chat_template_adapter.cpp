// TEMPORARY ADAPTER: see chat_template_adapter.h. Delete when the jinja
// branch's src/chat/chat_template.h is merged.
#include "server/chat_template_adapter.h"

#include "kvgraph/error.h"

namespace kvgraph::chat {

namespace {

using ojson = nlohmann::ordered_json;

std::string text_of(const ojson& m) {
  std::string s = m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
  if (m.contains("tool_calls") && m["tool_calls"].is_array())
    for (const auto& c : m["tool_calls"]) {
      const ojson& fn = c.contains("function") ? c["function"] : c;
      ojson call = {{"name", fn.value("name", "")}, {"arguments", fn.contains("arguments") ? fn["arguments"] : ojson::object()}};
      s += (s.empty() ? "" : "\n") + std::string("<tool_call>\n") + call.dump() + "\n</tool_call>";
    }
  return s;
}

std::string tools_text(const ojson& tools) {
  if (tools.empty()) return "";
  std::string s = "# Tools\n\nYou may call one or more functions. Function signatures:\n<tools>\n";
  for (const auto& t : tools) s += t.dump() + "\n";
  return s + "</tools>\nFor each call, return <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>";
}

}  // namespace

std::string render_conversation(const std::filesystem::path&, const Model&, const Tokenizer& tok,
                                const ojson& messages, const ojson& tools, bool add_generation_prompt, const ojson&) {
  if (!messages.is_array()) fail("chat_template", "messages must be an array");
  auto has = [&](const char* t) { return tok.token_to_id(t).has_value(); };
  const std::string tools_block = tools_text(tools);
  std::string out;
  if (has("<|im_start|>")) {
    bool system_done = false;
    for (const auto& m : messages) {
      std::string role = m.value("role", "user");
      std::string text = text_of(m);
      if (role == "system" || role == "developer") {
        if (!tools_block.empty()) text += "\n\n" + tools_block;
        role = "system";
        system_done = true;
      } else if (!system_done && !tools_block.empty()) {
        out += "<|im_start|>system\n" + tools_block + "<|im_end|>\n";
        system_done = true;
      }
      if (role == "tool") {
        role = "user";
        text = "<tool_response>\n" + text + "\n</tool_response>";
      }
      out += "<|im_start|>" + role + "\n" + text + "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
  } else if (has("<|start_header_id|>")) {
    out = "<|begin_of_text|>";
    for (const auto& m : messages) {
      std::string role = m.value("role", "user");
      if (role == "tool") role = "ipython";
      std::string text = text_of(m);
      if ((role == "system" || role == "developer") && !tools_block.empty()) text += "\n\n" + tools_block;
      out += "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + text + "<|eot_id|>";
    }
    if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  } else if (has("<start_of_turn>")) {
    std::string system = tools_block;
    for (const auto& m : messages) {
      std::string role = m.value("role", "user");
      if (role == "system" || role == "developer") {
        system = text_of(m) + (tools_block.empty() ? "" : "\n\n" + tools_block);
        continue;
      }
      std::string text = text_of(m);
      if (role == "user" && !system.empty()) {
        text = system + "\n\n" + text;
        system.clear();
      }
      out += "<start_of_turn>" + std::string(role == "assistant" ? "model" : "user") + "\n" + text + "<end_of_turn>\n";
    }
    if (add_generation_prompt) out += "<start_of_turn>model\n";
  } else {
    // A base model: the texts one per line, the system prompt (and tools) a
    // paragraph of its own; the model continues the last one.
    bool system_done = false;
    for (const auto& m : messages) {
      const std::string role = m.value("role", "user");
      std::string text = text_of(m);
      if (role == "system" || role == "developer") {
        out += text + (tools_block.empty() ? "" : "\n\n" + tools_block) + "\n\n";
        system_done = true;
        continue;
      }
      if (!system_done && !tools_block.empty()) out += tools_block + "\n\n";
      system_done = true;
      out += (out.empty() || out.ends_with("\n\n") ? "" : "\n") + text;
    }
  }
  return out;
}

}  // namespace kvgraph::chat
