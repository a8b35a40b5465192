// kvgraph generate: prompt (text or ids) -> streamed continuation.
#include <cstdio>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "kvgraph/error.h"

namespace kvgraph::cli {

namespace {

struct GenerateFlags {
  ModelFlags m;
  std::string prompt;
  std::string prompt_ids;
  int max_tokens = 64;
  bool greedy = false;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float repeat_penalty = 1.1f;
  uint64_t seed = 42;
  bool ignore_eos = false;
  bool json = false;
  std::string dump_logits;
  std::vector<std::string> stop;
};

void run_generate(const GenerateFlags& f) {
  // Every flag is checked before any work (the model is not yet loaded).
  f.m.check();
  check_at_least("--max-tokens", f.max_tokens, 1);
  // The flags as given, --greedy or not: a bad value is an error either way.
  check_sampling_flags({f.temperature, f.top_k, f.top_p, f.repeat_penalty, f.seed});
  double load_s = 0;
  auto model = load_model(f.m, &load_s);
  auto tok = load_tokenizer(*model, f.prompt_ids.empty());
  std::vector<int32_t> prompt;
  if (!f.prompt_ids.empty()) {
    prompt = parse_ids(f.prompt_ids, "--prompt-ids");
  } else {
    prompt = tok->encode(f.prompt, true);
  }
  if (prompt.empty()) fail("generate", "the prompt is empty (give text or --prompt-ids)");

  SessionOptions so;
  so.capacity = f.m.capacity > 0 ? f.m.capacity : request_capacity(model->config(), prompt.size(), f.max_tokens);
  so.max_write = f.m.chunk;
  so.eager = f.m.eager;
  so.tuning = f.m.tuning();
  so.kv_storage = f.m.kv_storage(model->device());
  if (static_cast<int64_t>(prompt.size()) > so.capacity)
    fail("generate", "prompt of {} tokens is longer than the cache capacity {} (raise --capacity)", prompt.size(),
         so.capacity);
  Session s(model, so);
  auto& sp = s.sampling();
  sp.temperature = f.greedy ? 0.0f : f.temperature;
  sp.top_k = f.top_k;
  sp.top_p = f.top_p;
  sp.repetition_penalty = f.greedy ? 1.0f : f.repeat_penalty;
  sp.seed = f.seed;

  std::ofstream dump;
  if (!f.dump_logits.empty()) {
    dump.open(f.dump_logits, std::ios::binary);
    if (!dump) fail("generate", "--dump-logits: cannot write {}", f.dump_logits);
  }
  auto dump_row = [&] {
    if (!dump) return;
    auto l = s.last_logits();
    dump.write(reinterpret_cast<const char*>(l.data()), l.size() * sizeof(float));
  };

  GenerateOptions go;
  go.max_tokens = f.max_tokens;
  go.stop = f.stop;
  go.ignore_eos = f.ignore_eos;
  int printed = 0;
  // Streams the text (or, without a tokenizer, the ids) as it is generated.
  auto on_token = [&](int32_t id, std::string_view text) {
    if (id >= 0) dump_row();  // the logits this token was sampled from
    if (f.json) return;
    if (tok) {
      fwrite(text.data(), 1, text.size(), stdout);
    } else if (id >= 0) {
      fmt::print("{}{}", printed++ ? " " : "", id);
    }
    fflush(stdout);
  };
  GenerateResult r = s.generate(prompt, tok ? &*tok : nullptr, go, on_token);
  if (r.finish == FinishReason::eos) dump_row();  // the end token's row: one row per sampled token
  if (r.finish == FinishReason::length) {
    if (!f.json) fmt::print("\n");
    fail("generate", "cache is full after {} new tokens: {} of {} positions used (raise --capacity)", r.tokens.size(),
         s.position(), s.capacity());
  }
  const int n_decode = std::max<int>(0, static_cast<int>(r.tokens.size()) - 1);
  const double decode_ms = n_decode ? r.decode_seconds * 1e3 / n_decode : 0.0;

  if (f.json) {
    nlohmann::json j;
    j["ids"] = r.tokens;
    j["prompt_ids"] = prompt;
    if (tok) j["text"] = r.text;
    // The JSON contract predates FinishReason: a max-tokens finish has always
    // been "length" here (OpenAI's name); a full cache is an error above.
    j["stop_reason"] = r.finish == FinishReason::max_tokens ? "length" : finish_reason_name(r.finish);
    j["device"] = device_name(model->device());
    j["compiled"] = !f.m.eager;
    j["captures"] = s.captures();
    j["prefill_ms"] = r.prefill_seconds * 1e3;
    j["decode_ms_per_token"] = decode_ms;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("\n");
  }
  if (!f.m.quiet)
    fmt::print(stderr, "[kvgraph] load {:.2f} s | prompt {} tok in {:.1f} ms ({:.0f} tok/s) | generated {} tok, "
               "{:.2f} ms/tok ({:.1f} tok/s) | {} decode, {} capture(s)\n",
               load_s, prompt.size(), r.prefill_seconds * 1e3, prompt.size() / std::max(r.prefill_seconds, 1e-9),
               r.tokens.size(), decode_ms, n_decode ? n_decode / std::max(r.decode_seconds, 1e-9) : 0.0,
               f.m.eager ? "eager" : "compiled", s.captures());
}

}  // namespace

void add_generate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* c = app.add_subcommand("generate", "Continue a prompt")->fallthrough();
  c->footer(
      "Examples:\n"
      "  kvgraph generate \"The meaning of life is\"\n"
      "  kvgraph generate -m ~/models/Qwen2.5-0.5B --device cuda \"Once upon a time\" --max-tokens 128\n"
      "  kvgraph generate -m DIR --prompt-ids 1,2,3 --max-tokens 32 --greedy --ignore-eos --json");
  f->m.add(*c);
  c->add_option("prompt", f->prompt, "Prompt text");
  c->add_option("--prompt-ids", f->prompt_ids, "Prompt as token ids: \"1,2,3\"");
  c->add_option("-n,--max-tokens", f->max_tokens, "Tokens to generate")->capture_default_str();
  c->add_flag("--greedy", f->greedy, "Arg-max decoding (temperature 0)");
  c->add_option("--temperature", f->temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  c->add_option("--top-k", f->top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  c->add_option("--top-p", f->top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  c->add_option("--repeat-penalty", f->repeat_penalty, "Repetition penalty (1 = off)")->capture_default_str();
  c->add_option("--seed", f->seed, "Sampling seed")->capture_default_str();
  c->add_flag("--ignore-eos", f->ignore_eos, "Never sample end-of-sequence tokens (their logits are masked)");
  c->add_option("--stop", f->stop, "Stop when the output contains this string (repeatable)");
  c->add_flag("--json", f->json, "Print one JSON object instead of streaming text");
  c->add_option("--dump-logits", f->dump_logits, "Write the raw f32 logits of every sampled token to FILE");
  c->callback([f] { run_generate(*f); });
}

}  // namespace kvgraph::cli
