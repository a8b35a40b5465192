#pragma once
// Per-family chat formats: what `kvgraph chat` and `kvgraph serve` use for a
// checkpoint that ships no chat template (chat_template.h prefers the
// template). Each mirrors what its family's own template renders for plain
// system / user / assistant turns; a base model without chat tokens (the
// embedded default) gets the "plain" format, which simply continues the text.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvgraph/model.h"
#include "kvgraph/tokenizer.h"

namespace kvgraph::chat {

struct ChatFormat {
  std::string name = "";
  std::string system_prefix = "", system_suffix = "";  // around the system prompt, before the first user turn
  bool system_in_user = false;  // no system role: the system prompt opens the first user message
  std::string user_prefix = "", user_suffix = "";       // around a user message
  std::string assistant_prefix = "";  // opens an assistant turn (the generation prompt)
  std::string end_of_turn = "";       // token text that ends an assistant turn
  std::string between_turns = "";     // text after an ended turn, before the next user turn

  // The whole conversation: `bos` (the tokenizer's BOS as text, or ""), then
  // the turns. `messages` is a JSON array of {"role": "system" | "user" |
  // "assistant", "content": string or null}; a system message may only come
  // first. Anything else throws Error("[chat] ...").
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const std::string& bos) const;
};

// The format for this model, picked by the special tokens its tokenizer has
// (<|start_header_id|>: llama3, <|im_start|>: chatml, <start_of_turn>: gemma,
// [INST] or the Mistral family: mistral), else "plain".
ChatFormat chat_format(const Model& model, const Tokenizer& tok);

// The tokenizer's prefix special tokens (BOS) as text, when that text
// encodes back to exactly those ids (they are added tokens); "" otherwise.
std::string bos_text(const Tokenizer& tok);

}  // namespace kvgraph::chat
