// kvgraph cache-prompt: prefill a prompt and save the session to a file that
// `generate --prompt-cache FILE` restores (Session::save / restore).
#include <fmt/format.h>

#include "cli/common.h"
#include "kvgraph/error.h"

namespace kvgraph::cli {

namespace {

struct CachePromptFlags {
  ModelFlags m;
  std::string text, prompt, file, prompt_ids, output;
  CLI::Option *text_opt = nullptr, *prompt_opt = nullptr, *file_opt = nullptr, *ids_opt = nullptr;
};

void run_cache_prompt(const CachePromptFlags& f) {
  f.m.check();
  const int given = int(f.text_opt->count() > 0) + int(f.prompt_opt->count() > 0) + int(f.file_opt->count() > 0) +
                    int(f.ids_opt->count() > 0);
  if (given != 1) usage_fail("give exactly one prompt: TEXT, -p/--prompt, -f/--file or --prompt-ids");
  auto model = load_model(f.m);
  std::vector<int32_t> prompt;
  if (f.ids_opt->count()) {
    prompt = parse_ids(f.prompt_ids, "--prompt-ids");
  } else {
    std::string text = f.prompt_opt->count() ? f.prompt : f.text_opt->count() ? f.text : read_file(f.file, "--file");
    if (f.file_opt->count() && !text.empty() && text.back() == '\n') text.pop_back();
    prompt = load_tokenizer(*model, true)->encode(text, true);
  }
  if (prompt.empty()) fail("cache_prompt", "the prompt is empty");
  SessionOptions so;
  // The prompt's own length unless --capacity says more: the file keeps only
  // the rows written, and generate restores it into the capacity it needs.
  so.capacity = f.m.capacity > 0 ? f.m.capacity : request_capacity(model->config(), prompt.size(), 0);
  if (static_cast<int64_t>(prompt.size()) > so.capacity)
    fail("cache_prompt", "prompt of {} tokens is longer than the cache capacity {} (raise --capacity)", prompt.size(),
         so.capacity);
  so.max_write = f.m.prefill_chunk();
  so.eager = f.m.eager;
  so.tuning = f.m.tuning();
  so.kv_storage = f.m.kv_storage(model->device());
  Session s(model, so);
  const auto t0 = std::chrono::steady_clock::now();
  s.prefill(prompt);
  s.save(f.output);
  if (!f.m.quiet)
    fmt::print(stderr, "[kvgraph] cached {} prompt tokens in {} ({:.2f} MB, {:.1f} ms)\n", prompt.size(), f.output,
               std::filesystem::file_size(f.output) / 1e6, seconds_since(t0) * 1e3);
}

}  // namespace

void add_cache_prompt(CLI::App& app) {
  auto f = std::make_shared<CachePromptFlags>();
  CLI::App* c = app.add_subcommand("cache-prompt", "Prefill a prompt and save the session state to a file");
  c->footer(
      "The file is read by `kvgraph generate --prompt-cache FILE` (same model, --chunk and --kv-dtype), which\n"
      "keeps the longest common prefix of its prompt with the cached one and prefills only the rest.\n"
      "Example:\n"
      "  kvgraph cache-prompt -m DIR -f system.txt -o system.kvs\n"
      "  kvgraph generate -m DIR -f question.txt --prompt-cache system.kvs");
  f->m.add(*c);
  f->text_opt = c->add_option("text", f->text, "Prompt text");
  f->prompt_opt = c->add_option("-p,--prompt", f->prompt, "Prompt text (same as TEXT)");
  f->file_opt = c->add_option("-f,--file", f->file, "Read the prompt from FILE (one final newline dropped)")
                    ->type_name("FILE");
  f->ids_opt = c->add_option("--prompt-ids", f->prompt_ids, "Prompt as token ids: \"1,2,3\"");
  c->add_option("-o,--output", f->output, "Session file to write (atomically)")->type_name("FILE")->required();
  c->callback([f] { run_cache_prompt(*f); });
}

}  // namespace kvgraph::cli
