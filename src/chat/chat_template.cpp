#include "chat/chat_template.h"

#include <fstream>
#include <sstream>

#include "chat/chat_format.h"
#include "kvgraph/error.h"

namespace kvgraph::chat {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxJsonDepth = 64;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("chat_template", "cannot read {}", p.string());
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) fail("chat_template", "cannot read {}", p.string());
  return s.str();
}

// tokenizer_config.json, or null when the checkpoint has none.
nlohmann::ordered_json read_tokenizer_config(const fs::path& dir) {
  const fs::path p = dir / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return nullptr;
  const std::string text = read_text(p);
  try {
    return nlohmann::ordered_json::parse(text, [&](int depth, nlohmann::ordered_json::parse_event_t,
                                                   nlohmann::ordered_json&) {
      if (depth > kMaxJsonDepth)
        fail("chat_template", "{}: JSON nested deeper than {} levels", p.string(), kMaxJsonDepth);
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    fail("chat_template", "{}: not valid JSON: {}", p.string(), e.what());
  }
}

// A special token of tokenizer_config.json: "<s>" or {"content": "<s>", ...}.
std::optional<std::string> config_token(const nlohmann::ordered_json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return std::nullopt;
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

nlohmann::ordered_json tokens_of(const nlohmann::ordered_json& cfg) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"})
    if (auto t = config_token(cfg, key)) out[key] = *t;
  return out;
}

}  // namespace

nlohmann::ordered_json special_tokens(const fs::path& model_dir) { return tokens_of(read_tokenizer_config(model_dir)); }

ChatTemplate ChatTemplate::parse(std::string source, std::string origin, nlohmann::ordered_json special_tokens) {
  try {
    jinja::Template t = jinja::Template::parse(source);
    return ChatTemplate(std::move(t), std::move(source), std::move(origin), std::move(special_tokens));
  } catch (const jinja::TemplateError& e) {
    throw jinja::TemplateError(e.line(), e.message(), origin);
  }
}

std::optional<ChatTemplate> ChatTemplate::from_model_dir(const fs::path& dir, std::string_view name) {
  std::error_code ec;
  const bool is_default = name == "default";
  const fs::path file = is_default ? dir / "chat_template.jinja"
                                   : dir / "additional_chat_templates" / (std::string(name) + ".jinja");
  const nlohmann::ordered_json cfg = read_tokenizer_config(dir);
  if (fs::is_regular_file(file, ec)) return parse(read_text(file), file.filename().string(), tokens_of(cfg));

  const nlohmann::ordered_json* t = cfg.is_object() && cfg.contains("chat_template") ? &cfg["chat_template"] : nullptr;
  if (t && t->is_string()) {
    if (is_default) return parse(t->get<std::string>(), "tokenizer_config.json", tokens_of(cfg));
    fail("chat_template", "{} has a single chat template, not one named \"{}\"", (dir / "tokenizer_config.json").string(),
         name);
  }
  if (t && t->is_array()) {
    std::string names;
    for (const auto& entry : *t) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
          !entry["template"].is_string())
        fail("chat_template", "{}: \"chat_template\" entries must be {{\"name\": ..., \"template\": ...}}",
             (dir / "tokenizer_config.json").string());
      const std::string n = entry["name"].get<std::string>();
      if (n == name)
        return parse(entry["template"].get<std::string>(), "tokenizer_config.json (" + n + ")", tokens_of(cfg));
      names += (names.empty() ? "" : ", ") + n;
    }
    fail("chat_template", "{} has no chat template named \"{}\" (it has: {})", (dir / "tokenizer_config.json").string(),
         name, names);
  }
  if (t && !t->is_null())
    fail("chat_template", "{}: \"chat_template\" must be a string or a list of named templates",
         (dir / "tokenizer_config.json").string());
  if (!is_default) fail("chat_template", "{} has no chat template named \"{}\"", dir.string(), name);
  return std::nullopt;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return render(context, jinja::RenderOptions{});
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context, const jinja::RenderOptions& options) const {
  try {
    return template_.render(context, options);
  } catch (const jinja::TemplateLimitError& e) {
    throw jinja::TemplateLimitError(e.line(), e.message(), origin_);
  } catch (const jinja::TemplateError& e) {
    throw jinja::TemplateError(e.line(), e.message(), origin_);
  }
}

std::string render_conversation(const fs::path& model_dir, const Model& model, const Tokenizer& tok,
                                const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                bool add_generation_prompt, const nlohmann::ordered_json& extra) {
  std::optional<ChatTemplate> t;
  if (!model_dir.empty()) t = ChatTemplate::from_model_dir(model_dir);
  return render_conversation(t ? &*t : nullptr, model_dir, model, tok, messages, tools, add_generation_prompt, extra);
}

std::string render_conversation(const ChatTemplate* tmpl, const fs::path& model_dir, const Model& model,
                                const Tokenizer& tok, const nlohmann::ordered_json& messages,
                                const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                const nlohmann::ordered_json& extra) {
  if (!messages.is_array()) fail("chat", "messages must be a JSON array, not {}", messages.type_name());
  if (!tools.is_null() && !tools.is_array()) fail("chat", "tools must be a JSON array, not {}", tools.type_name());
  if (!extra.is_null() && !extra.is_object()) fail("chat", "template variables must be a JSON object");
  const bool has_tools = tools.is_array() && !tools.empty();
  if (!tmpl) {
    if (has_tools)
      fail("chat", "this model has no chat template, and tools need one (give a template file: --template FILE)");
    return chat_format(model, tok).render(messages, add_generation_prompt, bos_text(tok));
  }
  // The special tokens transformers passes (special_tokens_map), then the
  // caller's variables, then the three it always passes.
  nlohmann::ordered_json ctx = tmpl->special_tokens();
  std::error_code ec;
  if (ctx.empty() && !model_dir.empty()) {
    if (fs::is_regular_file(model_dir / "tokenizer_config.json", ec)) {
      ctx = special_tokens(model_dir);
    } else {  // no tokenizer_config.json: what the tokenizer knows
      if (auto id = tok.bos_id())
        if (auto t = tok.id_to_token(*id)) ctx["bos_token"] = *t;
      if (auto id = tok.eos_id())
        if (auto t = tok.id_to_token(*id)) ctx["eos_token"] = *t;
    }
  }
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) ctx[k] = v;
  ctx["messages"] = messages;
  ctx["tools"] = has_tools ? tools : nlohmann::ordered_json();
  ctx["add_generation_prompt"] = add_generation_prompt;
  return tmpl->render(ctx);
}

std::vector<int32_t> encode_conversation(const Tokenizer& tok, std::string_view text) { return tok.encode(text, false); }

std::vector<int32_t> end_of_turn_ids(const Model& model, const Tokenizer& tok) {
  std::vector<int32_t> ids;
  auto add = [&](std::string_view t) {
    if (t.empty()) return;
    if (auto id = tok.token_to_id(t))
      if (std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  };
  add(chat_format(model, tok).end_of_turn);
  for (const char* t : {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>"}) add(t);
  return ids;
}

}  // namespace kvgraph::chat
