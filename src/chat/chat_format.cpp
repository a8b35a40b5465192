#include "chat/chat_format.h"

#include "kvgraph/error.h"

namespace kvgraph::chat {

ChatFormat chat_format(const Model& m, const Tokenizer& tok) {
  auto has = [&](const char* t) { return tok.token_to_id(t).has_value(); };
  if (has("<|start_header_id|>"))
    return {.name = "llama3",
            .system_prefix = "<|start_header_id|>system<|end_header_id|>\n\n",
            .system_suffix = "<|eot_id|>",
            .user_prefix = "<|start_header_id|>user<|end_header_id|>\n\n",
            .user_suffix = "<|eot_id|>",
            .assistant_prefix = "<|start_header_id|>assistant<|end_header_id|>\n\n",
            .end_of_turn = "<|eot_id|>"};
  if (has("<|im_start|>"))
    return {.name = "chatml",
            .system_prefix = "<|im_start|>system\n",
            .system_suffix = "<|im_end|>\n",
            .user_prefix = "<|im_start|>user\n",
            .user_suffix = "<|im_end|>\n",
            .assistant_prefix = "<|im_start|>assistant\n",
            .end_of_turn = "<|im_end|>",
            .between_turns = "\n"};
  if (has("<start_of_turn>"))
    return {.name = "gemma",
            .system_in_user = true,
            .user_prefix = "<start_of_turn>user\n",
            .user_suffix = "<end_of_turn>\n",
            .assistant_prefix = "<start_of_turn>model\n",
            .end_of_turn = "<end_of_turn>",
            .between_turns = "\n"};
  if (has("[INST]") || m.config().family == Family::Mistral)
    return {.name = "mistral", .system_in_user = true, .user_prefix = "[INST] ", .user_suffix = " [/INST]",
            .end_of_turn = "</s>"};
  // A base model: the user text is continued; the system prompt is its own
  // paragraph and each message starts on a new line.
  return {.name = "plain", .system_suffix = "\n\n", .between_turns = "\n"};
}

std::string bos_text(const Tokenizer& tok) {
  std::string text;
  for (int32_t id : tok.prefix_special_ids()) {
    auto t = tok.id_to_token(id);
    if (!t) return "";
    text += *t;
  }
  if (text.empty()) return "";
  const auto back = tok.encode(text, false);
  const auto want = tok.prefix_special_ids();
  return std::equal(back.begin(), back.end(), want.begin(), want.end()) ? text : "";
}

std::string ChatFormat::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const std::string& bos) const {
  if (!messages.is_array()) fail("chat", "messages must be a JSON array, not {}", messages.type_name());
  std::string out = bos;
  std::string system;
  bool first_user = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      fail("chat", "message {}: expected an object with a \"role\" string", i);
    const std::string role = m["role"].get<std::string>();
    std::string content;
    if (m.contains("content") && !m["content"].is_null()) {
      if (!m["content"].is_string())
        fail("chat", "message {}: the {} format takes \"content\" as a string (this model has no chat template)", i,
             name);
      content = m["content"].get<std::string>();
    }
    if (role == "system") {
      if (i != 0) fail("chat", "message {}: a system message may only come first", i);
      system = content;
      if (!system_in_user && !system.empty()) out += system_prefix + system + system_suffix;
    } else if (role == "user") {
      if (!first_user) out += between_turns;
      if (first_user && system_in_user && !system.empty()) content = system + "\n\n" + content;
      out += user_prefix + content + user_suffix;
      first_user = false;
    } else if (role == "assistant") {
      out += assistant_prefix + content + end_of_turn;
    } else {
      fail("chat", "message {}: role \"{}\" needs the model's chat template (this model has none; the {} format "
                   "knows system, user and assistant)",
           i, role, name);
    }
  }
  if (add_generation_prompt) out += assistant_prefix;
  return out;
}

}  // namespace kvgraph::chat
