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
  if (f.max_tokens < 1) fail("generate", "--max-tokens must be at least 1, got {}", f.max_tokens);
  double load_s = 0;
  auto model = load_model(f.m, &load_s);
  const ModelConfig& cfg = model->config();
  auto tok = load_tokenizer(*model, f.prompt_ids.empty());
  std::vector<int32_t> prompt;
  if (!f.prompt_ids.empty()) {
    prompt = parse_ids(f.prompt_ids, "--prompt-ids");
  } else {
    prompt = tok->encode(f.prompt, true);
  }
  if (prompt.empty()) fail("generate", "the prompt is empty (give text or --prompt-ids)");

  SessionOptions so;
  so.capacity = f.m.capacity > 0 ? f.m.capacity : static_cast<int32_t>(prompt.size()) + f.max_tokens;
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
  std::vector<int32_t> eos = cfg.eos_token_ids;
  if (tok && tok->eos_id() && std::find(eos.begin(), eos.end(), *tok->eos_id()) == eos.end())
    eos.push_back(*tok->eos_id());
  if (f.ignore_eos) s.set_banned_tokens(eos);

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

  auto t0 = std::chrono::steady_clock::now();
  s.prefill(prompt);
  int32_t t = s.sample();
  const double prefill_s = seconds_since(t0);
  dump_row();

  std::vector<int32_t> out;
  std::string text;
  std::optional<StreamDecoder> sd;
  if (tok) sd.emplace(*tok, true);
  auto t1 = std::chrono::steady_clock::now();
  std::string stop_reason = "length";
  for (int i = 0; i < f.max_tokens; ++i) {
    if (std::find(eos.begin(), eos.end(), t) != eos.end() && !f.ignore_eos) {
      stop_reason = "eos";
      break;
    }
    out.push_back(t);
    if (sd) {
      std::string piece = sd->step(t);
      text += piece;
      if (!f.json) {
        fwrite(piece.data(), 1, piece.size(), stdout);
        fflush(stdout);
      }
      bool stopped = false;
      for (const auto& st : f.stop)
        if (!st.empty() && text.find(st) != std::string::npos) {
          text.resize(text.find(st));
          stopped = true;
        }
      if (stopped) {
        stop_reason = "stop";
        break;
      }
    } else if (!f.json) {
      fmt::print("{}{}", i ? " " : "", t);
      fflush(stdout);
    }
    if (i + 1 == f.max_tokens) break;
    t = s.decode();
    dump_row();
  }
  if (sd && stop_reason != "stop") {
    std::string rest = sd->flush();
    text += rest;
    if (!f.json) fwrite(rest.data(), 1, rest.size(), stdout);
  }
  const double decode_s = seconds_since(t1);
  const int n_decode = std::max<int>(0, static_cast<int>(out.size()) - 1);

  if (f.json) {
    nlohmann::json j;
    j["ids"] = out;
    j["prompt_ids"] = prompt;
    if (tok) j["text"] = text;
    j["stop_reason"] = stop_reason;
    j["device"] = device_name(model->device());
    j["compiled"] = !f.m.eager;
    j["captures"] = s.captures();
    j["prefill_ms"] = prefill_s * 1e3;
    j["decode_ms_per_token"] = n_decode ? decode_s * 1e3 / n_decode : 0.0;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("\n");
  }
  if (!f.m.quiet)
    fmt::print(stderr, "[kvgraph] load {:.2f} s | prompt {} tok in {:.1f} ms ({:.0f} tok/s) | generated {} tok, "
               "{:.2f} ms/tok ({:.1f} tok/s) | {} decode, {} capture(s)\n",
               load_s, prompt.size(), prefill_s * 1e3, prompt.size() / std::max(prefill_s, 1e-9), out.size(),
               n_decode ? decode_s * 1e3 / n_decode : 0.0, n_decode ? n_decode / std::max(decode_s, 1e-9) : 0.0,
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
