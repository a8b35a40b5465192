// kvgraph chat: an interactive conversation that keeps the KV cache between
// turns (each turn prefills only its own new tokens).
#include <iostream>

#include <fmt/format.h>

#include "cli/common.h"
#include "kvgraph/error.h"

namespace kvgraph::cli {

namespace {

// Per-family chat formats (as the families' chat templates render them).
struct ChatFormat {
  std::string name;
  std::string system_prefix, system_suffix;
  std::string user_prefix, user_suffix;  // user_suffix opens the assistant turn
  std::string end_of_turn;               // token text that ends the assistant turn
};

ChatFormat chat_format(const Model& m, const Tokenizer& tok) {
  auto has = [&](const char* t) { return tok.token_to_id(t).has_value(); };
  if (has("<|start_header_id|>"))
    return {"llama3", "<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>",
            "<|start_header_id|>user<|end_header_id|>\n\n",
            "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"};
  if (has("<|im_start|>"))
    return {"chatml", "<|im_start|>system\n", "<|im_end|>\n", "<|im_start|>user\n",
            "<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>"};
  if (has("<start_of_turn>"))
    return {"gemma", "", "", "<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n", "<end_of_turn>"};
  if (has("[INST]") || m.config().family == Family::Mistral) return {"mistral", "", "", "[INST] ", " [/INST]", "</s>"};
  return {"plain", "", "", "", "", ""};  // a base model: the user text is continued
}

struct ChatFlags {
  ModelFlags m;
  std::string system;
  int max_tokens = 256;
  float temperature = 0.7f;
  int top_k = 40;
  float top_p = 0.95f;
  float repeat_penalty = 1.1f;
  uint64_t seed = 42;
};

void run_chat(const ChatFlags& f) {
  f.m.check();
  check_at_least("--max-tokens", f.max_tokens, 1);
  const ops::SamplingParams sampling{f.temperature, f.top_k, f.top_p, f.repeat_penalty, f.seed};
  check_sampling_flags(sampling);
  auto model = load_model(f.m);
  auto tok = *load_tokenizer(*model, true);
  ChatFormat fmt_ = chat_format(*model, tok);
  SessionOptions so;
  so.capacity = f.m.capacity > 0 ? f.m.capacity : std::min(4096, std::max(256, model->config().max_position_embeddings));
  so.max_write = f.m.chunk;
  so.eager = f.m.eager;
  so.tuning = f.m.tuning();
  so.kv_storage = f.m.kv_storage(model->device());
  Session s(model, so);
  s.sampling() = sampling;
  GenerateOptions go;
  go.max_tokens = f.max_tokens;
  if (!fmt_.end_of_turn.empty())
    if (auto id = tok.token_to_id(fmt_.end_of_turn)) go.extra_eos.push_back(*id);

  fmt::print(stderr, "[kvgraph] chat ({} format, cache {} tokens). Empty line or Ctrl-D ends.\n", fmt_.name,
             s.capacity());
  bool first = true;
  int32_t pending = -1;  // last sampled token, not yet in the cache; -1: none
  std::string line;
  while (true) {
    fmt::print("> ");
    fflush(stdout);
    if (!std::getline(std::cin, line) || line.empty()) break;
    std::string turn;
    if (first && !f.system.empty()) turn += fmt_.system_prefix + f.system + fmt_.system_suffix;
    turn += fmt_.user_prefix + line + fmt_.user_suffix;
    std::vector<int32_t> ids;
    if (pending >= 0) ids.push_back(pending);
    auto enc = tok.encode(turn, first);
    ids.insert(ids.end(), enc.begin(), enc.end());
    if (s.position() + static_cast<int64_t>(ids.size()) + 1 > s.capacity()) {
      fmt::print(stderr, "[kvgraph] the conversation fills the cache ({} tokens); starting over\n", s.capacity());
      s.reset();
      first = true;
      pending = -1;
      continue;
    }
    first = false;
    auto t0 = std::chrono::steady_clock::now();
    GenerateResult r = s.generate(ids, &tok, go, [](int32_t, std::string_view text) {
      fwrite(text.data(), 1, text.size(), stdout);
      fflush(stdout);
    });
    fmt::print("\n");
    fflush(stdout);
    if (!f.m.quiet)
      fmt::print(stderr, "[kvgraph] turn: prefilled {} new tokens, generated {}, cache {}/{} ({:.2f} s)\n", ids.size(),
                 r.tokens.size(), s.position(), s.capacity(), seconds_since(t0));
    pending = r.last;  // the stop token (or the last one shown), not yet in the cache
  }
}

}  // namespace

void add_chat(CLI::App& app) {
  auto f = std::make_shared<ChatFlags>();
  CLI::App* c = app.add_subcommand("chat", "Interactive chat; the cache is kept between turns");
  c->footer("Example:\n  kvgraph chat -m ~/models/Qwen2.5-0.5B-Instruct --system \"You are terse.\"");
  f->m.add(*c);
  c->add_option("--system", f->system, "System prompt");
  c->add_option("-n,--max-tokens", f->max_tokens, "Most tokens per reply")->capture_default_str();
  c->add_option("--temperature", f->temperature)->capture_default_str();
  c->add_option("--top-k", f->top_k)->capture_default_str();
  c->add_option("--top-p", f->top_p)->capture_default_str();
  c->add_option("--repeat-penalty", f->repeat_penalty)->capture_default_str();
  c->add_option("--seed", f->seed)->capture_default_str();
  c->callback([f] { run_chat(*f); });
}

}  // namespace kvgraph::cli
