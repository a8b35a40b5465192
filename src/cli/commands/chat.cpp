// kvgraph chat: an interactive conversation that keeps the KV cache between
// turns (each turn prefills only its own new tokens).
//
// The conversation is a list of turns (the user's message, the reply's ids).
// A message that does not fit what the cache has left makes room by dropping
// the oldest turns (the system prompt stays) and prefilling what is kept
// again; the user's input is never dropped. Ctrl-C stops the reply being
// written, not the program.
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

#include "cli/common.h"
#include "kvgraph/error.h"

namespace kvgraph::cli {

namespace {

// Per-family chat formats (as the families' chat templates render them).
struct ChatFormat {
  std::string name = "";
  std::string system_prefix = "", system_suffix = "";  // around the system prompt, before the first user turn
  bool system_in_user = false;  // no system role: the system prompt opens the first user message
  std::string user_prefix = "", user_suffix = "";  // user_suffix opens the assistant turn
  std::string end_of_turn = "";    // token text that ends the assistant turn
  std::string between_turns = "";  // text after an ended turn, before the next user turn
};

ChatFormat chat_format(const Model& m, const Tokenizer& tok) {
  auto has = [&](const char* t) { return tok.token_to_id(t).has_value(); };
  if (has("<|start_header_id|>"))
    return {.name = "llama3",
            .system_prefix = "<|start_header_id|>system<|end_header_id|>\n\n",
            .system_suffix = "<|eot_id|>",
            .user_prefix = "<|start_header_id|>user<|end_header_id|>\n\n",
            .user_suffix = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            .end_of_turn = "<|eot_id|>"};
  if (has("<|im_start|>"))
    return {.name = "chatml",
            .system_prefix = "<|im_start|>system\n",
            .system_suffix = "<|im_end|>\n",
            .user_prefix = "<|im_start|>user\n",
            .user_suffix = "<|im_end|>\n<|im_start|>assistant\n",
            .end_of_turn = "<|im_end|>",
            .between_turns = "\n"};
  if (has("<start_of_turn>"))
    return {.name = "gemma",
            .system_in_user = true,
            .user_prefix = "<start_of_turn>user\n",
            .user_suffix = "<end_of_turn>\n<start_of_turn>model\n",
            .end_of_turn = "<end_of_turn>",
            .between_turns = "\n"};
  if (has("[INST]") || m.config().family == Family::Mistral)
    return {.name = "mistral", .system_in_user = true, .user_prefix = "[INST] ", .user_suffix = " [/INST]",
            .end_of_turn = "</s>"};
  // A base model: the user text is continued; the system prompt is its own
  // paragraph and each message starts on a new line.
  return {.name = "plain", .system_suffix = "\n\n", .between_turns = "\n"};
}

// The conversation as the cache should hold it: the chat format's text for
// each user message, and each reply's ids as sampled. The cache holds
// ids()[0, position); the rest (the last sampled token, an end of turn we
// appended) goes in first with the next message.
class Conversation {
 public:
  struct Turn {
    std::string message;         // as typed
    std::vector<int32_t> user;   // its ids as they stand in the conversation (first turn: BOS, system prompt)
    std::vector<int32_t> reply;  // then the end token sampled, or the format's end of turn when the reply was cut
  };

  Conversation(const Tokenizer& tok, ChatFormat format, std::string system)
      : tok_(tok), fmt_(std::move(format)), system_(std::move(system)) {}

  const ChatFormat& format() const { return fmt_; }
  std::vector<Turn>& turns() { return turns_; }

  // The ids of `message` as the first turn (BOS, the system prompt) or as a later one.
  std::vector<int32_t> user_ids(const std::string& message, bool first) const {
    std::string text;
    if (!first) {
      text = fmt_.between_turns + fmt_.user_prefix + message + fmt_.user_suffix;
    } else if (system_.empty()) {
      text = fmt_.user_prefix + message + fmt_.user_suffix;
    } else if (fmt_.system_in_user) {
      text = fmt_.user_prefix + system_ + "\n\n" + message + fmt_.user_suffix;
    } else {
      text = fmt_.system_prefix + system_ + fmt_.system_suffix + fmt_.user_prefix + message + fmt_.user_suffix;
    }
    std::vector<int32_t> ids;
    if (first) ids.assign(tok_.prefix_special_ids().begin(), tok_.prefix_special_ids().end());
    auto enc = tok_.encode(text, false);
    ids.insert(ids.end(), enc.begin(), enc.end());
    return ids;
  }

  // Tokens of turns [from, end) with turn `from` rendered as the first.
  int64_t length_from(size_t from) const {
    int64_t n = 0;
    for (size_t i = from; i < turns_.size(); ++i)
      n += static_cast<int64_t>(i == from && from > 0 ? user_ids(turns_[i].message, true).size()
                                                      : turns_[i].user.size()) +
           static_cast<int64_t>(turns_[i].reply.size());
    return n;
  }

  // Forgets turns [0, n); the first one left becomes the first turn.
  void drop_oldest(size_t n) {
    turns_.erase(turns_.begin(), turns_.begin() + static_cast<std::ptrdiff_t>(n));
    if (!turns_.empty()) turns_.front().user = user_ids(turns_.front().message, true);
  }

  std::vector<int32_t> ids() const {
    std::vector<int32_t> all;
    for (const auto& t : turns_) {
      all.insert(all.end(), t.user.begin(), t.user.end());
      all.insert(all.end(), t.reply.begin(), t.reply.end());
    }
    return all;
  }

 private:
  const Tokenizer& tok_;
  ChatFormat fmt_;
  std::string system_;
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
};

void run_chat(const ChatFlags& f) {
  f.m.check();
  check_at_least("--max-tokens", f.max_tokens, 1);
  const uint64_t seed = f.seed_given ? f.seed : std::random_device{}();
  const ops::SamplingParams sampling{f.temperature, f.top_k, f.top_p, f.repeat_penalty, seed};
  check_sampling_flags(sampling);
  auto model = load_model(f.m);
  auto tok = *load_tokenizer(*model, true);
  Conversation conv(tok, chat_format(*model, tok), f.system);
  SessionOptions so;
  so.capacity = f.m.capacity > 0 ? f.m.capacity : std::min(4096, std::max(256, model->config().max_position_embeddings));
  so.max_write = f.m.chunk;
  so.eager = f.m.eager;
  so.tuning = f.m.tuning();
  so.kv_storage = f.m.kv_storage(model->device());
  Session s(model, so);
  s.sampling() = sampling;
  const int64_t capacity = s.capacity();
  GenerateOptions go;
  go.max_tokens = f.max_tokens;
  go.stop = f.stop;
  go.cancel = &g_interrupted;
  std::optional<int32_t> end_of_turn;
  if (!conv.format().end_of_turn.empty()) end_of_turn = tok.token_to_id(conv.format().end_of_turn);
  if (end_of_turn) go.extra_eos.push_back(*end_of_turn);

  if (!f.m.quiet) {
    fmt::print(stderr, "[kvgraph] chat ({} format, cache {} tokens): /help lists the commands, Ctrl-D or /exit ends\n",
               conv.format().name, capacity);
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
    // Make room: the cache must hold the conversation, the message and one
    // reply token. When it cannot, drop the oldest turns; having to prefill
    // again anyway, drop enough for a whole reply when that is possible.
    auto& turns = conv.turns();
    std::vector<int32_t> user = conv.user_ids(message, turns.empty());
    size_t drop = 0;
    if (conv.length_from(0) + static_cast<int64_t>(user.size()) + 1 > capacity) {
      std::optional<size_t> fits, fits_reply;
      for (size_t k = 1; k <= turns.size() && !fits_reply; ++k) {
        const int64_t n = conv.length_from(k) + static_cast<int64_t>(conv.user_ids(message, k == turns.size()).size());
        if (!fits && n + 1 <= capacity) fits = k;
        if (n + f.max_tokens <= capacity) fits_reply = k;
      }
      if (!fits) {
        const int64_t alone = static_cast<int64_t>(conv.user_ids(message, true).size());
        const int64_t frame = static_cast<int64_t>(conv.user_ids("", true).size());
        fmt::print(stderr,
                   "kvgraph: error: [chat] message of {} tokens does not fit the cache of {}: with the system prompt "
                   "and chat format ({} tokens) and one reply token it needs {} (raise --capacity); not sent, the "
                   "conversation is kept\n",
                   alone - frame, capacity, frame, alone + 1);
        return;
      }
      drop = fits_reply ? *fits_reply : *fits;
    }
    std::vector<int32_t> ids;
    if (drop > 0) {
      conv.drop_oldest(drop);
      user = conv.user_ids(message, turns.empty());
      s.reset();
      ids = conv.ids();
      fmt::print(stderr, "[kvgraph] the conversation outgrew the cache ({} tokens): dropped the oldest {} turn{}, kept {}{}\n",
                 capacity, drop, drop == 1 ? "" : "s", turns.size(), f.system.empty() ? "" : " and the system prompt");
    } else {
      // The cache holds the conversation but its last id or two (the last
      // sampled token, an end of turn we appended): they go first.
      auto all = conv.ids();
      ids.assign(all.begin() + s.position(), all.end());
    }
    ids.insert(ids.end(), user.begin(), user.end());

    auto t0 = std::chrono::steady_clock::now();
    GenerateResult r = s.generate(ids, &tok, go, [](int32_t, std::string_view text) {
      fwrite(text.data(), 1, text.size(), stdout);
      fflush(stdout);
    });
    fmt::print("\n");
    fflush(stdout);
    Conversation::Turn turn{message, std::move(user), r.tokens};
    if (r.finish == FinishReason::eos)
      turn.reply.push_back(r.last);  // the end token
    else if (end_of_turn)
      turn.reply.push_back(*end_of_turn);  // close the turn the model did not close
    turns.push_back(std::move(turn));
    if (r.finish == FinishReason::length)
      fmt::print(stderr, "[kvgraph] reply cut after {} tokens: the cache is full ({} tokens)\n", r.tokens.size(),
                 capacity);
    if (r.finish == FinishReason::cancelled)
      fmt::print(stderr, "[kvgraph] reply interrupted after {} tokens\n", r.tokens.size());
    if (!f.m.quiet)
      fmt::print(stderr, "[kvgraph] turn: prefilled {} new tokens, generated {}, cache {}/{} ({:.2f} s)\n", ids.size(),
                 r.tokens.size(), s.position(), capacity, seconds_since(t0));
  };

  // Runs a command line ("/help"); false for /exit.
  auto command = [&](const std::string& line) {
    const std::string cmd = line.substr(0, line.find_last_not_of(" \t") + 1);
    if (cmd == "/exit") return false;
    if (cmd == "/help") {
      fmt::print("{}", kHelp);
    } else if (cmd == "/reset") {
      conv.turns().clear();
      s.reset();
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
      if (!command(message)) return;
    } else if (message.find_first_not_of(" \t\r\n") != std::string::npos) {
      send(message[0] == '/' ? message.substr(1) : message);
    }
    if (got != LineReader::Got::line) break;
  }
  fmt::print("\n");  // the shell's prompt starts on its own line
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
  c->callback([f, c] {
    f->seed_given = c->count("--seed") > 0;
    run_chat(*f);
  });
}

}  // namespace kvgraph::cli
