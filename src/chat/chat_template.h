#pragma once
// A checkpoint's chat template, rendered as transformers' apply_chat_template
// renders it (jinja.h: the same output as Python's jinja2, byte for byte),
// and the conversation renderer `kvgraph chat` and `kvgraph serve` share.
//
//   auto t = ChatTemplate::from_model_dir(dir);   // nullopt: the checkpoint has none
//   std::string text = t->render({{"messages", msgs}, {"add_generation_prompt", true},
//                                 {"bos_token", "<s>"}, {"eos_token", "</s>"}});
//   std::vector<int32_t> ids = encode_conversation(tok, text);
//
// Errors (a template's syntax, raise_exception, a bad context, a sandbox
// violation, a render limit) are one kvgraph::Error; for a template error a
// jinja::TemplateError whose message() is the bare message (e.g. "Conversation
// roles must alternate user/assistant/user/assistant/..."). A ChatTemplate is
// immutable: several threads may render one at once.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/jinja.h"
#include "kvgraph/model.h"
#include "kvgraph/tokenizer.h"

namespace kvgraph::chat {

class ChatTemplate {
 public:
  // Throws jinja::TemplateError on a syntax error (with its line); `origin`
  // names the source in messages ("tokenizer_config.json", a file).
  // `special_tokens` ({"bos_token": ..., ...}, see special_tokens()) are the
  // checkpoint's, which render_conversation passes to the template.
  static ChatTemplate parse(std::string source, std::string origin = "template",
                            nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());

  // The template of the checkpoint in `dir`, as transformers finds it:
  // `name` "default": chat_template.jinja, else tokenizer_config.json's
  // "chat_template" (a string, or the entry named "default" of a list of
  // {"name", "template"}); another name: additional_chat_templates/NAME.jinja,
  // else the list entry of that name. nullopt when the checkpoint has no
  // template (and `name` is "default"); a name it does not have, or a
  // malformed tokenizer_config.json, is an error.
  static std::optional<ChatTemplate> from_model_dir(const std::filesystem::path& dir,
                                                    std::string_view name = "default");

  // `context`: {"messages": [...], "tools": [...] (optional), "add_generation_prompt": bool,
  // "bos_token": "...", "eos_token": "...", plus any extra keys (e.g. enable_thinking)}.
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::ordered_json& context, const jinja::RenderOptions& options) const;

  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  ChatTemplate(jinja::Template t, std::string source, std::string origin, nlohmann::ordered_json special_tokens)
      : template_(std::move(t)),
        source_(std::move(source)),
        origin_(std::move(origin)),
        special_tokens_(std::move(special_tokens)) {}
  jinja::Template template_;
  std::string source_, origin_;
  nlohmann::ordered_json special_tokens_;
};

// The special tokens transformers passes to a template (its
// special_tokens_map): bos_token, eos_token, unk_token, pad_token as
// tokenizer_config.json in `model_dir` sets them (a string, or an object
// with "content"); those it does not set are left out, as transformers
// leaves them out. Without a tokenizer_config.json: {}.
nlohmann::ordered_json special_tokens(const std::filesystem::path& model_dir);

// The conversation as the model should see it: the checkpoint's template
// when `model_dir` has one, else the per-family format (chat_format.h; it
// knows no tools: tools without a template are an error). The template gets
// the variables transformers passes: the special tokens (special_tokens();
// without a tokenizer_config.json, the tokenizer's BOS and EOS), then
// `extra`'s keys (e.g. {"enable_thinking": false}), then messages, tools
// (null when empty) and add_generation_prompt. `model_dir` may be empty (a
// model without files): the format is used.
std::string render_conversation(const std::filesystem::path& model_dir, const Model& model, const Tokenizer& tok,
                                const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                bool add_generation_prompt, const nlohmann::ordered_json& extra = {});
// The same with the template given (`tmpl` null: the per-family format); its
// special tokens when it has them, else those of `model_dir`.
std::string render_conversation(const ChatTemplate* tmpl, const std::filesystem::path& model_dir,
                                const Model& model, const Tokenizer& tok, const nlohmann::ordered_json& messages,
                                const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                const nlohmann::ordered_json& extra = {});

// The ids of a rendered conversation. A template writes the special tokens
// itself (BOS included, as text the tokenizer reads back as the token), so
// nothing is added: transformers' apply_chat_template encodes with
// add_special_tokens=False too. The per-family format writes the BOS as
// text the same way (chat_format.h bos_text).
std::vector<int32_t> encode_conversation(const Tokenizer& tok, std::string_view text);

// Ids that end an assistant turn besides the model's EOS, among
// <|eot_id|>, <|eom_id|>, <|im_end|>, <end_of_turn>, <|end|> and the
// per-family format's end of turn: those this tokenizer has.
std::vector<int32_t> end_of_turn_ids(const Model& model, const Tokenizer& tok);

}  // namespace kvgraph::chat
