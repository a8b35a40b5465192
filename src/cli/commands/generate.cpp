// kvgraph generate: prompt (text or ids) -> streamed continuation.
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "kvgraph/error.h"
#include "kvgraph/speculative.h"

namespace kvgraph::cli {

namespace {

struct GenerateFlags {
  ModelFlags m;
  // Prompt sources: at most one (with none, a piped stdin is read).
  std::string text;        // positional TEXT; "-" reads stdin
  std::string prompt;      // -p/--prompt TEXT
  std::string file;        // -f/--file FILE; "-" reads stdin
  std::string prompt_ids;  // --prompt-ids "1,2,3"
  CLI::Option *text_opt = nullptr, *prompt_opt = nullptr, *file_opt = nullptr, *ids_opt = nullptr;
  CLI::Option* seed_opt = nullptr;
  int max_tokens = 64;
  bool greedy = false;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float repeat_penalty = 1.0f;  // off: --temperature 0 is exactly --greedy
  uint64_t seed = 0;            // without --seed: drawn from std::random_device and reported
  bool ignore_eos = false;
  bool json = false;
  std::string dump_logits;
  std::vector<std::string> stop;
  std::string prompt_cache;  // --prompt-cache FILE
  // Speculative decoding: a draft model or prompt lookup, K proposals a step.
  std::string draft_model;   // --draft-model DIR
  int draft_tokens = 4;      // --draft-tokens K
  int lookup_ngram = 0;      // --lookup-ngram N
  CLI::Option *draft_opt = nullptr, *draft_tokens_opt = nullptr, *lookup_opt = nullptr;
  bool speculative() const { return draft_opt->count() || lookup_opt->count(); }
};

// Where the prompt comes from, as resolved from the flags.
struct PromptSource {
  std::optional<std::string> text;  // text to tokenize
  std::string ids;                  // --prompt-ids, when text is empty
};

// A file or stdin as a prompt: the whole of it, less one final newline (the
// one `echo` and editors add). Empty is an error: nothing came where a
// prompt was expected.
std::string prompt_from(const std::string& path) {
  std::string what = path == "-" ? "stdin" : "--file " + path;
  std::string s = path == "-" ? read_stdin("prompt") : read_file(path, "--file");
  if (s.size() >= 1 && s.back() == '\n') s.pop_back();
  if (s.size() >= 1 && s.back() == '\r') s.pop_back();
  if (s.empty()) fail("generate", "the prompt from {} is empty", what);
  return s;
}

// Checks that at most one source was given (a usage error otherwise), then
// reads it. Nothing given and stdin not a terminal: stdin is the prompt.
// The speculative flags, checked before any work: one proposer, K within
// what one verify step takes (and below --chunk, so a ring can roll back).
void check_speculative_flags(const GenerateFlags& f) {
  if (f.draft_opt->count() && f.lookup_opt->count())
    usage_fail("give one of --draft-model and --lookup-ngram, not both");
  if (f.draft_tokens_opt->count() && !f.speculative())
    usage_fail("--draft-tokens needs --draft-model DIR or --lookup-ngram N");
  if (!f.speculative()) return;
  if (f.lookup_opt->count()) check_at_least("--lookup-ngram", f.lookup_ngram, 1);
  const int max_k = std::min(Session::kMaxVerifyTokens, f.m.prefill_chunk()) - 1;
  if (max_k < 1) usage_fail("speculative decoding needs --chunk of at least 2 (a verify step of K + 1 tokens), got {}", f.m.prefill_chunk());
  if (f.draft_tokens < 1 || f.draft_tokens > max_k)
    usage_fail("--draft-tokens {}: expected an integer in [1, {}] (a verify step of K + 1 <= {} tokens, within --chunk {})",
               f.draft_tokens, max_k, std::min(Session::kMaxVerifyTokens, f.m.prefill_chunk()), f.m.prefill_chunk());
  if (!f.dump_logits.empty())
    usage_fail("--dump-logits cannot be combined with --draft-model or --lookup-ngram (tokens come several a step)");
}

// A draft model must speak the target's vocabulary: the same number of ids
// and, where both have a tokenizer, the same token at every id.
void check_draft_vocabulary(const Model& target, const std::optional<Tokenizer>& target_tok, const Model& draft,
                            const std::string& dir) {
  if (draft.config().vocab_size != target.config().vocab_size)
    fail("generate", "--draft-model {}: its vocabulary has {} ids, the model's {}; a draft must share the model's "
         "tokenizer and vocabulary", dir, draft.config().vocab_size, target.config().vocab_size);
  const std::optional<Tokenizer> dt = load_tokenizer(draft, false);
  if (!target_tok || !dt) return;
  if (dt->vocab_size() != target_tok->vocab_size())
    fail("generate", "--draft-model {}: its tokenizer has {} tokens, the model's {}", dir, dt->vocab_size(),
         target_tok->vocab_size());
  for (int32_t id = 0; id < target_tok->vocab_size(); ++id)
    if (dt->id_to_token(id) != target_tok->id_to_token(id))
      fail("generate", "--draft-model {}: token {} is \"{}\" there and \"{}\" in the model's tokenizer", dir, id,
           dt->id_to_token(id).value_or(""), target_tok->id_to_token(id).value_or(""));
}

PromptSource resolve_prompt(const GenerateFlags& f) {
  std::vector<std::string> given;
  if (f.text_opt->count()) given.push_back(f.text == "-" ? "- (stdin)" : "TEXT");
  if (f.prompt_opt->count()) given.push_back("--prompt");
  if (f.file_opt->count()) given.push_back("--file");
  if (f.ids_opt->count()) given.push_back("--prompt-ids");
  if (given.size() > 1)
    usage_fail("give one prompt: {} and {} were both given (TEXT, -p/--prompt, -f/--file, --prompt-ids or stdin)",
               given[0], given[1]);
  PromptSource p;
  if (f.ids_opt->count()) {
    p.ids = f.prompt_ids;
  } else if (f.prompt_opt->count()) {
    p.text = f.prompt;  // as given, even empty: generation from the tokenizer's BOS alone
  } else if (f.file_opt->count()) {
    p.text = prompt_from(f.file);
  } else if (f.text_opt->count()) {
    p.text = f.text == "-" ? prompt_from("-") : f.text;
  } else if (!isatty(STDIN_FILENO)) {
    p.text = prompt_from("-");
  } else {
    usage_fail("no prompt: give TEXT, -p/--prompt TEXT, -f/--file FILE or --prompt-ids, or pipe it on stdin");
  }
  return p;
}

void run_generate(const GenerateFlags& f) {
  // Every flag is checked before any work (the model is not yet loaded).
  f.m.check();
  check_at_least("--max-tokens", f.max_tokens, 1);
  // The flags as given, --greedy or not: a bad value is an error either way.
  check_sampling_flags({f.temperature, f.top_k, f.top_p, f.repeat_penalty, f.seed});
  check_speculative_flags(f);
  const uint64_t seed = f.seed_opt->count() ? f.seed : std::random_device{}();
  const PromptSource source = resolve_prompt(f);

  double load_s = 0;
  auto model = load_model(f.m, &load_s);
  auto tok = load_tokenizer(*model, source.text.has_value());
  std::vector<int32_t> prompt = source.text ? tok->encode(*source.text, true) : parse_ids(source.ids, "--prompt-ids");
  if (prompt.empty()) fail("generate", "the prompt is empty (give text or --prompt-ids)");

  SessionOptions so;
  // Sized by the request, capped at the trained positions, in 64 bits: a
  // huge --max-tokens costs nothing until the tokens are generated.
  so.capacity = f.m.capacity > 0 ? f.m.capacity : request_capacity(model->config(), prompt.size(), f.max_tokens);
  so.max_write = f.m.prefill_chunk();
  so.eager = f.m.eager;
  so.tuning = f.m.tuning();
  // A verify step's rows must be the decode steps' bit for bit; steps of
  // several tokens take x in f32, so one-token steps do too. Plain decoding
  // over int8/int4 weights on CUDA takes int8 x by default, whose greedy
  // choices can differ: say so.
  if (f.speculative() && so.tuning.quantized_int8_x) {
    so.tuning.quantized_int8_x = false;
    if (model->device() == Device::CUDA && model->quantization().quantized() && !f.m.quiet)
      fmt::print(stderr, "[kvgraph] speculative decoding over {} weights takes x in f32: its output is that of "
                 "plain decoding with --tune qx=f32 (plain decoding's default int8 x may choose other tokens)\n",
                 format_name(model->quantization(), DType::BF16));
  }
  so.kv_storage = f.m.kv_storage(model->device());
  if (static_cast<int64_t>(prompt.size()) > so.capacity)
    fail("generate", "prompt of {} tokens is longer than the cache capacity {} (raise --capacity)", prompt.size(),
         so.capacity);
  Session s(model, so);
  // --prompt-cache: restore the file when it exists (a file of another model
  // or layout, or a damaged one, is an error, never silently ignored), then
  // keep the common prefix; a missing file is created from this prompt.
  bool cache_restored = false;
  if (!f.prompt_cache.empty() && std::filesystem::exists(f.prompt_cache)) {
    s.restore(f.prompt_cache);
    cache_restored = true;
  }
  auto& sp = s.sampling();
  sp.temperature = f.greedy ? 0.0f : f.temperature;
  sp.top_k = f.top_k;
  sp.top_p = f.top_p;
  sp.repetition_penalty = f.greedy ? 1.0f : f.repeat_penalty;
  sp.seed = seed;

  Output out(stdout, "to stdout", "generate");
  std::optional<Output> dump;
  if (!f.dump_logits.empty()) dump.emplace(f.dump_logits, "--dump-logits " + f.dump_logits, "generate");
  auto dump_row = [&] {
    if (!dump) return;
    auto l = s.last_logits();
    dump->write(std::string_view(reinterpret_cast<const char*>(l.data()), l.size() * sizeof(float)));
  };

  // The proposer: prompt lookup, or a draft model in its own session.
  std::unique_ptr<Proposer> proposer;
  std::string method;
  if (f.lookup_opt->count()) {
    proposer = std::make_unique<PromptLookup>(f.lookup_ngram);
    method = fmt::format("prompt lookup (n-gram {})", f.lookup_ngram);
  } else if (f.draft_opt->count()) {
    ModelFlags df = f.m;
    df.model = f.draft_model;
    auto draft = load_model(df);
    check_draft_vocabulary(*model, tok, *draft, f.draft_model);
    SessionOptions dso = so;
    dso.kv_storage = df.kv_storage(draft->device());
    proposer = std::make_unique<DraftModel>(draft, dso);
    method = fmt::format("draft model {}", f.draft_model);
  }

  GenerateOptions go;
  go.max_tokens = f.max_tokens;
  go.proposer = proposer.get();
  go.draft_tokens = f.draft_tokens;
  go.stop = f.stop;
  go.ignore_eos = f.ignore_eos;
  go.reuse_prefix = !f.prompt_cache.empty();
  if (!f.prompt_cache.empty() && !cache_restored) {
    s.prefill(prompt);
    s.save(f.prompt_cache);
  }
  int printed = 0;
  // Streams the text (or, without a tokenizer, the ids) as it is generated.
  auto on_token = [&](int32_t id, std::string_view text) {
    if (id >= 0) dump_row();  // the logits this token was sampled from
    if (f.json) return;
    if (tok) {
      out.write(text);
    } else if (id >= 0) {
      out.write(fmt::format("{}{}", printed++ ? " " : "", id));
    }
    out.flush();
  };
  GenerateResult r = s.generate(prompt, tok ? &*tok : nullptr, go, on_token);
  if (r.finish == FinishReason::eos) dump_row();  // the end token's row: one row per sampled token
  const int n_decode = std::max<int>(0, static_cast<int>(r.tokens.size()) - 1);
  const double decode_ms = n_decode ? r.decode_seconds * 1e3 / n_decode : 0.0;

  if (f.json) {
    nlohmann::json j;
    j["ids"] = r.tokens;
    j["prompt_ids"] = prompt;
    if (tok) j["text"] = r.text;
    j["finish_reason"] = finish_reason_name(r.finish);  // eos, stop, max_tokens or length (the cache is full)
    j["seed"] = seed;
    j["capacity"] = s.capacity();
    j["device"] = device_name(model->device());
    j["compiled"] = !f.m.eager;
    j["captures"] = s.captures();
    j["prefill_ms"] = r.prefill_seconds * 1e3;
    if (!f.prompt_cache.empty()) j["prompt_cache_reused"] = r.reused;
    j["decode_ms_per_token"] = decode_ms;
    if (proposer) {
      const SpeculativeStats& st = r.speculative;
      j["speculative"] = {{"method", f.lookup_opt->count() ? "lookup" : "draft"},
                          {"draft_tokens", f.draft_tokens},
                          {"verify_steps", st.steps},
                          {"plain_steps", st.plain_steps},
                          {"proposed", st.proposed},
                          {"accepted", st.accepted},
                          {"acceptance_rate", st.acceptance()},
                          {"tokens_per_second", n_decode ? n_decode / std::max(r.decode_seconds, 1e-9) : 0.0}};
      if (f.lookup_opt->count()) j["speculative"]["lookup_ngram"] = f.lookup_ngram;
    }
    out.write(j.dump() + "\n");
  } else {
    out.write("\n");
  }
  out.finish();  // the line is complete (and written) before any notice on stderr
  if (dump) dump->finish();
  // A full cache ends generation like max_tokens does; the notice says why it
  // ended early. Not progress, so -q keeps it.
  if (r.finish == FinishReason::length)
    fmt::print(stderr, "[kvgraph] stopped after {} tokens: the cache is full ({} of {} positions); raise --capacity\n",
               r.tokens.size(), s.position(), s.capacity());
  if (!f.prompt_cache.empty() && !f.m.quiet)
    fmt::print(stderr, "[kvgraph] prompt cache {}: {} {} of {} prompt tokens, prefilled {}\n", f.prompt_cache,
               cache_restored ? "reused" : "created; reused", r.reused, prompt.size(), prompt.size() - r.reused);
  if (proposer && !f.m.quiet) {
    const SpeculativeStats& st = r.speculative;
    fmt::print(stderr, "[kvgraph] speculative, {}, K {}: {} verify steps ({} plain), {} proposed, {} accepted "
               "({:.1f}%), {:.2f} tokens a step\n", method, f.draft_tokens, st.steps, st.plain_steps, st.proposed,
               st.accepted, 100.0 * st.acceptance(),
               st.steps + st.plain_steps ? double(n_decode) / double(st.steps + st.plain_steps) : 0.0);
  }
  if (!f.m.quiet)
    fmt::print(stderr, "[kvgraph] load {:.2f} s | prompt {} tok in {:.1f} ms ({:.0f} tok/s) | generated {} tok, "
               "{:.2f} ms/tok ({:.1f} tok/s) | {} decode, {} capture(s) | seed {}\n",
               load_s, prompt.size(), r.prefill_seconds * 1e3, prompt.size() / std::max(r.prefill_seconds, 1e-9),
               r.tokens.size(), decode_ms, n_decode ? n_decode / std::max(r.decode_seconds, 1e-9) : 0.0,
               f.m.eager ? "eager" : "compiled", s.captures(), seed);
}

}  // namespace

void add_generate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* c = app.add_subcommand("generate", "Continue a prompt")->fallthrough();
  c->footer(
      "The prompt is one of: TEXT, -p TEXT, -f FILE, --prompt-ids IDS, or stdin (`-`, or piped with no prompt).\n"
      "Examples:\n"
      "  kvgraph generate \"The meaning of life is\"\n"
      "  echo \"Once upon a time\" | kvgraph generate --max-tokens 32 --seed 7\n"
      "  kvgraph generate -m ~/models/Qwen2.5-0.5B --device cuda -f prompt.txt --max-tokens 128\n"
      "  kvgraph generate -m DIR --prompt-ids 1,2,3 --max-tokens 32 --greedy --ignore-eos --json\n"
      "  kvgraph generate -f passage.txt --greedy --lookup-ngram 3 --draft-tokens 4\n"
      "  kvgraph generate -m ~/models/Llama-3.1-8B --draft-model ~/models/Llama-3.2-1B --draft-tokens 4 \"...\"");
  f->m.add(*c);
  f->text_opt = c->add_option("text", f->text, "Prompt text; - reads stdin");
  f->prompt_opt = c->add_option("-p,--prompt", f->prompt, "Prompt text (same as TEXT)");
  f->file_opt = c->add_option("-f,--file", f->file, "Read the prompt from FILE (- for stdin; one final newline dropped)")
                    ->type_name("FILE");
  f->ids_opt = c->add_option("--prompt-ids", f->prompt_ids, "Prompt as token ids: \"1,2,3\"");
  c->add_option("-n,--max-tokens", f->max_tokens,
                "Most tokens to generate (the cache is sized by it, up to the model's trained positions)")
      ->capture_default_str();
  c->add_flag("--greedy", f->greedy, "Arg-max decoding (temperature 0)");
  c->add_option("--temperature", f->temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  c->add_option("--top-k", f->top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  c->add_option("--top-p", f->top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  c->add_option("--repeat-penalty", f->repeat_penalty, "Repetition penalty (1 = off)")->capture_default_str();
  f->seed_opt = c->add_option("--seed", f->seed, "Sampling seed (default: random, reported on stderr and in --json)");
  c->add_flag("--ignore-eos", f->ignore_eos, "Never sample end-of-sequence tokens (their logits are masked)");
  c->add_option("--stop", f->stop, "End when the text contains this string; it is not printed (repeatable)");
  c->add_flag("--json", f->json, "Print one JSON object instead of streaming text");
  c->add_option("--prompt-cache", f->prompt_cache,
                "Session file from `kvgraph cache-prompt` (created from this prompt when missing): keep the common "
                "prefix, prefill the rest; output is identical to a run without it")
      ->type_name("FILE");
  c->add_option("--dump-logits", f->dump_logits, "Write the raw f32 logits of every sampled token to FILE")
      ->type_name("FILE");
  f->draft_opt = c->add_option("--draft-model", f->draft_model,
                               "Speculative decoding with this draft model (same tokenizer): it proposes "
                               "--draft-tokens tokens, the model verifies them in one step")
                     ->type_name("DIR");
  f->lookup_opt = c->add_option("--lookup-ngram", f->lookup_ngram,
                                "Speculative decoding by prompt lookup: the tokens after the earliest earlier "
                                "occurrence of the last N..1 tokens are the proposals")
                      ->type_name("N");
  f->draft_tokens_opt = c->add_option("--draft-tokens", f->draft_tokens,
                                      "Proposals verified per step, K (1-7, below --chunk); greedy output is "
                                      "identical to plain decoding, sampled output has the same distribution")
                            ->capture_default_str();
  c->callback([f] { run_generate(*f); });
}

}  // namespace kvgraph::cli
