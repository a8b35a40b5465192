// kvgraph chat: an interactive conversation that keeps the KV cache between
// turns. Each turn renders the whole conversation with the checkpoint's chat
// template (or the per-family format when it has none, chat/chat_format.h)
// and prefills only what differs from what the cache holds.
//
// The conversation is a list of turns (the user's message, the reply's text).
// A message that does not fit what the cache has left makes room by dropping
// the oldest turns (the system prompt stays); the user's input is never
// dropped. Ctrl-C stops the reply being written, not the program.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "chat/chat_format.h"
#include "chat/chat_template.h"
#include "cli/common.h"
#include "kvgraph/error.h"

namespace kvgraph::cli {

namespace {

// The conversation beside the cache: the system prompt and each turn's
// message and reply text. Every turn renders all of it with the chat
// template (or the per-family format) and encodes the text; the session
// keeps the longest common prefix of those ids with what it holds, so only
// the new tail is prefilled.
class Conversation {
 public:
  struct Turn {
    std::string message;  // as typed
    std::string reply;    // the reply's text (cut at a stop string; what was written before a Ctrl-C)
  };

  Conversation(const Model& model, const Tokenizer& tok, std::optional<chat::ChatTemplate> tmpl, std::string system,
               nlohmann::ordered_json vars)
      : model_(model), tok_(tok), tmpl_(std::move(tmpl)), system_(std::move(system)), vars_(std::move(vars)) {}

  std::vector<Turn>& turns() { return turns_; }
  std::string describe() const {
    return tmpl_ ? "chat template from " + tmpl_->origin() : chat::chat_format(model_, tok_).name + " format";
  }

  // The ids of turns [from, end) followed by `message`, ready for the reply.
  std::vector<int32_t> ids(size_t from, const std::string& message) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    const bool fold = !system_.empty() && fold_system_;
    if (!system_.empty() && !fold) messages.push_back({{"role", "system"}, {"content", system_}});
    bool first = true;
    auto user = [&](const std::string& text) {
      messages.push_back({{"role", "user"}, {"content", first && fold ? system_ + "\n\n" + text : text}});
      first = false;
    };
    for (size_t i = from; i < turns_.size(); ++i) {
      user(turns_[i].message);
      messages.push_back({{"role", "assistant"}, {"content", turns_[i].reply}});
    }
    user(message);
    std::string text;
    try {
      text = chat::render_conversation(tmpl_ ? &*tmpl_ : nullptr, model_.dir(), model_, tok_, messages, nullptr, true,
                                       vars_);
    } catch (const chat::jinja::TemplateError&) {
      // Templates without a system role (Gemma's) refuse one: the system
      // prompt then opens the first user message, as the per-family format does.
      if (system_.empty() || fold_system_) throw;
      fold_system_ = true;
      fmt::print(stderr, "[kvgraph] the chat template refuses a system message: the system prompt opens the first "
                         "user message instead\n");
      return ids(from, message);
    }
    return chat::encode_conversation(tok_, text);
  }

 private:
  const Model& model_;
  const Tokenizer& tok_;
  std::optional<chat::ChatTemplate> tmpl_;
  std::string system_;
  nlohmann::ordered_json vars_;
  bool fold_system_ = false;
  std::vector<Turn> turns_;
};

// Set by SIGINT. Generation polls it (GenerateOptions::cancel); the reader
// returns `interrupted` on it.
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

extern "C" void on_sigint(int) { g_interrupted.store(true, std::memory_order_relaxed); }

// Routes SIGINT to g_interrupted while it lives. SA_RESTART keeps output and
// reads going; the reader waits in poll(), which a signal always interrupts.
class SigintToFlag {
 public:
  SigintToFlag() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    installed_ = sigaction(SIGINT, &sa, &old_) == 0;
  }
  ~SigintToFlag() {
    if (installed_) sigaction(SIGINT, &old_, nullptr);
  }
  SigintToFlag(const SigintToFlag&) = delete;
  SigintToFlag& operator=(const SigintToFlag&) = delete;

 private:
  struct sigaction old_ {};
  bool installed_ = false;
};

// Lines from standard input, unbuffered by stdio so that Ctrl-C at the
// prompt is seen (std::getline would retry or fail the stream).
class LineReader {
 public:
  enum class Got { line, eof, interrupted };

  Got next(std::string& line) {
    while (true) {
      if (size_t nl = buf_.find('\n'); nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return Got::line;
      }
      if (eof_) {
        if (buf_.empty()) return Got::eof;
        line = std::move(buf_);  // a last line without a newline is still input
        buf_.clear();
        return Got::line;
      }
      if (g_interrupted.load(std::memory_order_relaxed)) return Got::interrupted;
      pollfd p{STDIN_FILENO, POLLIN, 0};
      if (::poll(&p, 1, -1) < 0) {
        if (errno == EINTR) continue;
        fail("chat", "reading standard input: {}", std::strerror(errno));
      }
      char chunk[4096];
      const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        fail("chat", "reading standard input: {}", std::strerror(errno));
      }
      if (n == 0)
        eof_ = true;
      else
        buf_.append(chunk, static_cast<size_t>(n));
    }
  }

 private:
  std::string buf_;
  bool eof_ = false;
};

constexpr const char* kHelp =
    "/help    this help\n"
    "/reset   forget the conversation (the system prompt is kept)\n"
    "/exit    end the chat (as Ctrl-D does)\n"
    "A line ending in \\ continues on the next line (the message keeps the line break).\n"
    "To send a message that starts with /, write // (//etc is sent as /etc).\n"
    "Ctrl-C stops the reply being written; Ctrl-C at the prompt or Ctrl-D ends the chat.\n"
    "When the conversation outgrows the cache, its oldest turns are dropped (the system prompt is kept).\n";

struct ChatFlags {
  ModelFlags m;
  std::string system;
  int max_tokens = 256;
  float temperature = 0.7f;
  int top_k = 40;
  float top_p = 0.95f;
  float repeat_penalty = 1.0f;
  uint64_t seed = 0;
  bool seed_given = false;  // else a random seed, reported on stderr
  std::vector<std::string> stop;
  std::string prompt_cache;                // --prompt-cache FILE
  std::string template_file;               // --template FILE
  std::string template_name;               // --template-name NAME
  std::vector<std::string> template_vars;  // --template-var KEY=VALUE
};

// --template-var KEY=VALUE: VALUE as JSON when it parses (false, 3, "x",
// [..]), else as a string.
nlohmann::ordered_json template_vars(const std::vector<std::string>& specs) {
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    if (eq == 0 || eq == std::string::npos) usage_fail("--template-var {}: expected KEY=VALUE", spec);
    const std::string value = spec.substr(eq + 1);
    nlohmann::ordered_json v = nlohmann::ordered_json::parse(value, nullptr, false);
    vars[spec.substr(0, eq)] = v.is_discarded() ? nlohmann::ordered_json(value) : v;
  }
  return vars;
}

// The template --template or --template-name asks for, else the checkpoint's own.
std::optional<chat::ChatTemplate> chat_template(const ChatFlags& f, const Model& model) {
  if (!f.template_file.empty())
    return chat::ChatTemplate::parse(read_file(f.template_file, "--template"), f.template_file,
                                     model.dir().empty() ? nlohmann::ordered_json::object()
                                                         : chat::special_tokens(model.dir()));
  if (model.dir().empty()) {
    if (!f.template_name.empty()) fail("chat", "--template-name {}: this model has no files to read templates from",
                                       f.template_name);
    return std::nullopt;
  }
  return chat::ChatTemplate::from_model_dir(model.dir(), f.template_name.empty() ? "default" : f.template_name);
}

void run_chat(const ChatFlags& f) {
  f.m.check();
  check_at_least("--max-tokens", f.max_tokens, 1);
  if (!f.template_file.empty() && !f.template_name.empty()) usage_fail("give --template or --template-name, not both");
  const nlohmann::ordered_json vars = template_vars(f.template_vars);
  const uint64_t seed = f.seed_given ? f.seed : std::random_device{}();
  const ops::SamplingParams sampling{f.temperature, f.top_k, f.top_p, f.repeat_penalty, seed};
  check_sampling_flags(sampling);
  auto model = load_model(f.m);
  auto tok = *load_tokenizer(*model, true);
  Conversation conv(*model, tok, chat_template(f, *model), f.system, vars);
  SessionOptions so;
  so.capacity = f.m.capacity > 0 ? f.m.capacity : std::min(4096, std::max(256, model->config().max_position_embeddings));
  so.max_write = f.m.prefill_chunk();
  so.eager = f.m.eager;
  so.tuning = f.m.tuning();
  so.kv_storage = f.m.kv_storage(model->device());
  Session s(model, so);
  // --prompt-cache: a session saved by an earlier chat (or cache-prompt);
  // its common prefix with the first turn is kept. A file of another model
  // or layout is an error, as in generate.
  if (!f.prompt_cache.empty() && std::filesystem::exists(f.prompt_cache)) {
    s.restore(f.prompt_cache);
    if (!f.m.quiet)
      fmt::print(stderr, "[kvgraph] prompt cache {}: restored {} tokens\n", f.prompt_cache, s.position());
  }
  s.sampling() = sampling;
  const int64_t capacity = s.capacity();
  GenerateOptions go;
  go.max_tokens = f.max_tokens;
  go.stop = f.stop;
  go.cancel = &g_interrupted;
  go.extra_eos = chat::end_of_turn_ids(*model, tok);

  if (!f.m.quiet) {
    fmt::print(stderr, "[kvgraph] chat ({}, cache {} tokens): /help lists the commands, Ctrl-D or /exit ends\n",
               conv.describe(), capacity);
    if (!f.seed_given) fmt::print(stderr, "[kvgraph] seed {} (--seed {} repeats this chat)\n", seed, seed);
  }
  SigintToFlag sigint;
  LineReader in;
  auto prompt = [](const char* p) {
    fmt::print("{}", p);
    fflush(stdout);
  };
  // Sends one message and shows the reply.
  auto send = [&](const std::string& message) {
    auto& turns = conv.turns();
    std::vector<int32_t> ids;
    size_t drop = 0;
    try {
      // Make room: the cache must hold the conversation, the message and one
      // reply token. When it cannot, drop the oldest turns; having to drop,
      // drop enough for a whole reply when that is possible.
      ids = conv.ids(0, message);
      if (static_cast<int64_t>(ids.size()) + 1 > capacity) {
        std::optional<size_t> fits, fits_reply;
        for (size_t k = 1; k <= turns.size() && !fits_reply; ++k) {
          const int64_t n = static_cast<int64_t>(conv.ids(k, message).size());
          if (!fits && n + 1 <= capacity) fits = k;
          if (n + f.max_tokens <= capacity) fits_reply = k;
        }
        if (!fits) {
          const int64_t alone = static_cast<int64_t>(conv.ids(turns.size(), message).size());
          const int64_t frame = static_cast<int64_t>(conv.ids(turns.size(), "").size());
          fmt::print(stderr,
                     "kvgraph: error: [chat] message of {} tokens does not fit the cache of {}: with the system prompt "
                     "and chat format ({} tokens) and one reply token it needs {} (raise --capacity); not sent, the "
                     "conversation is kept\n",
                     alone - frame, capacity, frame, alone + 1);
          return;
        }
        drop = fits_reply ? *fits_reply : *fits;
        ids = conv.ids(drop, message);
      }
    } catch (const Error& e) {  // the template refused the conversation (raise_exception, ...)
      fmt::print(stderr, "kvgraph: error: {}; not sent, the conversation is kept\n", e.what());
      return;
    }
    if (drop > 0) {
      turns.erase(turns.begin(), turns.begin() + static_cast<std::ptrdiff_t>(drop));
      fmt::print(stderr, "[kvgraph] the conversation outgrew the cache ({} tokens): dropped the oldest {} turn{}, kept {}{}\n",
                 capacity, drop, drop == 1 ? "" : "s", turns.size(), f.system.empty() ? "" : " and the system prompt");
    }
    // Keep what the cache shares with the new rendering; the last id is
    // always prefilled again (its logits start the reply).
    const auto& held = s.tokens();
    size_t common = 0;
    while (common < held.size() && common + 1 < ids.size() && held[common] == ids[common]) ++common;
    int32_t reprefilled = 0;
    if (common < static_cast<size_t>(s.position())) reprefilled = s.trim(static_cast<int32_t>(common)).reprefilled;
    const std::vector<int32_t> tail(ids.begin() + static_cast<std::ptrdiff_t>(common), ids.end());

    auto t0 = std::chrono::steady_clock::now();
    GenerateResult r = s.generate(tail, &tok, go, [](int32_t, std::string_view text) {
      fwrite(text.data(), 1, text.size(), stdout);
      fflush(stdout);
    });
    fmt::print("\n");
    fflush(stdout);
    turns.push_back({message, r.text});
    if (r.finish == FinishReason::length)
      fmt::print(stderr, "[kvgraph] reply cut after {} tokens: the cache is full ({} tokens)\n", r.tokens.size(),
                 capacity);
    if (r.finish == FinishReason::cancelled)
      fmt::print(stderr, "[kvgraph] reply interrupted after {} tokens\n", r.tokens.size());
    if (!f.m.quiet)
      fmt::print(stderr, "[kvgraph] turn: prefilled {} new tokens, generated {}, cache {}/{} ({:.2f} s)\n",
                 tail.size() + static_cast<size_t>(reprefilled), r.tokens.size(), s.position(), capacity,
                 seconds_since(t0));
  };

  // --prompt-cache: the session as it ends, for the next chat.
  auto save_cache = [&] {
    if (f.prompt_cache.empty()) return;
    s.save(f.prompt_cache);
    if (!f.m.quiet)
      fmt::print(stderr, "[kvgraph] prompt cache {}: saved {} tokens\n", f.prompt_cache, s.position());
  };

  // Runs a command line ("/help"); false for /exit.
  auto command = [&](const std::string& line) {
    const std::string cmd = line.substr(0, line.find_last_not_of(" \t") + 1);
    if (cmd == "/exit") return false;
    if (cmd == "/help") {
      fmt::print("{}", kHelp);
    } else if (cmd == "/reset") {
      conv.turns().clear();
      fmt::print(stderr, "[kvgraph] conversation forgotten (the system prompt is kept)\n");
    } else {
      fmt::print(stderr, "kvgraph: error: [chat] unknown command \"{}\": /help lists them (// sends a leading /)\n",
                 cmd.substr(0, cmd.find_first_of(" \t\n")));
    }
    return true;
  };

  std::string line;
  while (true) {
    // One message; a line ending in '\' continues it.
    g_interrupted = false;
    prompt("> ");
    LineReader::Got got = in.next(line);
    std::string message;
    while (got == LineReader::Got::line && !line.empty() && line.back() == '\\') {
      line.pop_back();
      message += line + "\n";
      prompt("... ");
      got = in.next(line);
    }
    if (got == LineReader::Got::interrupted) break;  // Ctrl-C at the prompt ends the chat
    if (got == LineReader::Got::line) message += line;
    // At EOF a continued message is still sent, then the chat ends.
    if (!message.empty() && message[0] == '/' && message.rfind("//", 0) != 0) {
      if (!command(message)) {
        save_cache();
        return;
      }
    } else if (message.find_first_not_of(" \t\r\n") != std::string::npos) {
      send(message[0] == '/' ? message.substr(1) : message);
    }
    if (got != LineReader::Got::line) break;
  }
  fmt::print("\n");  // the shell's prompt starts on its own line
  fflush(stdout);
  save_cache();
}

}  // namespace

void add_chat(CLI::App& app) {
  auto f = std::make_shared<ChatFlags>();
  CLI::App* c = app.add_subcommand("chat", "Interactive chat; the cache is kept between turns");
  c->footer(
      "Type /help in the chat for its commands. A line ending in \\ continues the message on the next line;\n"
      "Ctrl-C stops a reply, Ctrl-D or /exit ends the chat.\n"
      "Example:\n  kvgraph chat -m ~/models/Qwen2.5-0.5B-Instruct --system \"You are terse.\"");
  f->m.add(*c);
  c->add_option("--system", f->system, "System prompt");
  c->add_option("-n,--max-tokens", f->max_tokens, "Most tokens per reply")->capture_default_str();
  c->add_option("--temperature", f->temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  c->add_option("--top-k", f->top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  c->add_option("--top-p", f->top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  c->add_option("--repeat-penalty", f->repeat_penalty, "Repetition penalty (1 = off)")->capture_default_str();
  c->add_option("--seed", f->seed, "Sampling seed (default: random, reported on stderr)");
  c->add_option("--stop", f->stop, "End a reply when it contains this string (repeatable)");
  c->add_option("--template", f->template_file,
                "Jinja chat template file to use instead of the checkpoint's (tokenizer_config.json or "
                "chat_template.jinja)")
      ->type_name("FILE");
  c->add_option("--template-name", f->template_name,
                "Which of the checkpoint's named chat templates (e.g. tool_use); default: \"default\"")
      ->type_name("NAME");
  c->add_option("--template-var", f->template_vars,
                "A variable for the chat template, e.g. enable_thinking=false (VALUE is JSON, else a string; "
                "repeatable)")
      ->type_name("KEY=VALUE");
  c->add_option("--prompt-cache", f->prompt_cache,
                "Session file: restored at the start (its common prefix with the conversation is kept), saved at "
                "the end (created when missing); same model, --chunk and --kv-dtype")
      ->type_name("FILE");
  c->callback([f, c] {
    f->seed_given = c->count("--seed") > 0;
    run_chat(*f);
  });
}

}  // namespace kvgraph::cli
