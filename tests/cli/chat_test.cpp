// kvgraph chat driven through standard input, with the embedded default
// model (a base model: the "plain" format) and small --capacity values so the
// cache fills quickly. Nothing the user types is lost, and nothing that goes
// wrong is silent.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvgraph/tokenizer.h"
#include "support/run.h"
#include "support/temp_dir.h"

using namespace kvgraph::testing;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

namespace {

fs::path default_model() { return fs::path(KVGRAPH_SOURCE_DIR) / "models" / "default"; }

// Greedy, so every run of the same conversation says the same.
const std::string kGreedy = "chat --temperature 0 ";

// The per-turn stats line: "turn: prefilled P new tokens, generated G, cache C/N".
struct TurnStats {
  int prefilled, generated, cache;
};

std::vector<TurnStats> turn_stats(const std::string& err) {
  std::vector<TurnStats> turns;
  static const std::regex re(R"(turn: prefilled (\d+) new tokens, generated (\d+), cache (\d+)/)");
  for (std::sregex_iterator it(err.begin(), err.end(), re), end; it != end; ++it)
    turns.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), std::stoi((*it)[3])});
  return turns;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

// The reply of a chat of one message: stdout is "> " REPLY "\n" "> " "\n"
// (the last prompt, then the newline printed at end of input).
std::string only_reply(const RunResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("> ", 0), 0u) << r.out;
  EXPECT_THAT(r.out, EndsWith("\n> \n"));
  if (r.out.size() < 6) return "";
  return r.out.substr(2, r.out.size() - 6);
}

// `generate`'s text for the same prompt, greedy: stdout is TEXT "\n".
std::string generated(const std::string& args) {
  RunResult g = run_cli("generate --greedy -q " + args);
  EXPECT_EQ(g.exit_code, 0) << g.err;
  return g.out.empty() ? "" : g.out.substr(0, g.out.size() - 1);
}

}  // namespace

TEST(CliChat, MessageAfterAReplyCutAtTheCacheLimitIsAnswered) {
  // "la la ..." makes the model repeat "la" past the 48-token cache: the
  // reply is cut at the limit. The next message must still be answered: with
  // the cut turn dropped it stands alone, so its reply is that of a chat
  // holding only it.
  const std::string flags = kGreedy + "--capacity 48 --max-tokens 100";
  const std::string alone = only_reply(run_cli_with_input(flags, "A computer is\n"));
  ASSERT_FALSE(alone.empty());
  RunResult r = run_cli_with_input(flags, "la la la la la la la la\nA computer is\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, EndsWith("\n> " + alone + "\n> \n"));
  EXPECT_THAT(r.err, HasSubstr("reply cut after"));
  EXPECT_THAT(r.err, HasSubstr("the cache is full (48 tokens)"));
  EXPECT_THAT(r.err, HasSubstr("dropped the oldest 1 turn, kept 0"));
  EXPECT_EQ(turn_stats(r.err).size(), 2u) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("error")));
}

TEST(CliChat, OutgrownConversationDropsOnlyTheOldestTurns) {
  const std::vector<std::string> messages = {"Hello", "A computer is", "Once upon a time", "The meaning of life is",
                                             "Hello again", "A cat is"};
  std::string input;
  for (const auto& m : messages) input += m + "\n";
  RunResult r = run_cli_with_input(kGreedy + "--capacity 40 --max-tokens 6", input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto turns = turn_stats(r.err);
  ASSERT_EQ(turns.size(), messages.size()) << r.err;  // every message answered
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(dropped the oldest (\d+) turns?, kept (\d+))"))) << r.err;
  EXPECT_GE(std::stoi(m[2]), 1) << "newer turns are kept: " << r.err;
  for (const TurnStats& t : turns) EXPECT_LE(t.cache, 40);
  // A turn that kept earlier ones holds more than it prefilled and generated.
  EXPECT_GT(turns.back().cache, turns.back().prefilled + turns.back().generated) << r.err;
}

TEST(CliChat, MessageThatCanNeverFitIsRefusedAndTheChatGoesOn) {
  std::string words;
  for (int i = 0; i < 60; ++i) words += "word ";
  const auto tok = kvgraph::Tokenizer::from_file(default_model());
  const size_t n = tok.encode(words, false).size();
  ASSERT_GT(n + 2, 40u);
  RunResult r = run_cli_with_input(kGreedy + "--capacity 40 --max-tokens 5", "Hello\n" + words + "\nA computer is\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.err, "kvgraph: error: "), 1u) << r.err;
  EXPECT_THAT(r.err, HasSubstr("kvgraph: error: [chat] message of " + std::to_string(n) +
                               " tokens does not fit the cache of 40"));
  auto turns = turn_stats(r.err);
  ASSERT_EQ(turns.size(), 2u) << r.err;
  // The conversation was kept: the first turn is still in the cache.
  EXPECT_GT(turns[1].cache, turns[1].prefilled + turns[1].generated) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("dropped")));
}

TEST(CliChat, SlashCommands) {
  const std::string alone = only_reply(run_cli_with_input(kGreedy + "-n 20", "A computer is\n"));
  ASSERT_FALSE(alone.empty());
  RunResult r = run_cli_with_input(kGreedy + "-n 20",
                                   "/help\nA computer is\n/reset\nA computer is\n/nonsense\n/exit\nHello\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* c : {"/help", "/reset", "/exit", "\\"}) EXPECT_THAT(r.out, HasSubstr(c));
  // After /reset the same message starts afresh: the same cache and reply.
  // The cache still holds the first rendering's ids, of which all but the
  // last are the same, so they are kept and fewer are prefilled.
  auto turns = turn_stats(r.err);
  ASSERT_EQ(turns.size(), 2u) << r.err;  // nothing after /exit is sent
  EXPECT_EQ(turns[1].prefilled, 1);
  EXPECT_EQ(turns[1].cache, turns[0].cache);
  EXPECT_EQ(count(r.out, "> " + alone + "\n"), 2u) << r.out;
  EXPECT_EQ(count(r.err, "kvgraph: error: "), 1u) << r.err;
  EXPECT_THAT(r.err, HasSubstr("kvgraph: error: [chat] unknown command \"/nonsense\""));
  EXPECT_THAT(r.out, Not(HasSubstr("Hello")));
}

TEST(CliChat, DoubleSlashSendsALeadingSlash) {
  const std::string direct = generated("-n 12 '/etc is'");
  RunResult r = run_cli_with_input(kGreedy + "-n 12", "//etc is\n");
  EXPECT_EQ(only_reply(r), direct);
  EXPECT_THAT(r.err, Not(HasSubstr("error")));
}

TEST(CliChat, BackslashContinuesAMessageOnTheNextLine) {
  // The message is "The meaning \nof life is": on a base model that is the
  // prompt itself, so the reply is generate's.
  const std::string direct = generated("-n 20 'The meaning \nof life is'");
  RunResult r = run_cli_with_input(kGreedy + "-n 20", "The meaning \\\nof life is\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "> ... " + direct + "\n> \n");
  EXPECT_EQ(turn_stats(r.err).size(), 1u) << r.err;
}

TEST(CliChat, SystemPromptIsItsOwnParagraphOnABaseModel) {
  const std::string direct = generated("-n 20 'You are terse.\n\nA computer is'");
  RunResult r = run_cli_with_input(kGreedy + "-n 20 --system 'You are terse.'", "A computer is\n");
  EXPECT_EQ(only_reply(r), direct);
}

TEST(CliChat, StopStringEndsTheReply) {
  const std::string full = only_reply(run_cli_with_input(kGreedy + "-n 30", "The meaning of life is\n"));
  ASSERT_GT(full.size(), 12u);
  const std::string stop = full.substr(8, 3);
  RunResult r = run_cli_with_input(kGreedy + "-n 30 --stop '" + stop + "' --stop 'never in this reply'",
                                   "The meaning of life is\n");
  EXPECT_EQ(only_reply(r), full.substr(0, full.find(stop)));
}

TEST(CliChat, SeedIsRandomReportedAndRepeatable) {
  const std::string flags = "chat --temperature 1 -n 30";
  RunResult a = run_cli_with_input(flags, "Once upon a time\n");
  RunResult b = run_cli_with_input(flags, "Once upon a time\n");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  std::smatch ma, mb;
  ASSERT_TRUE(std::regex_search(a.err, ma, std::regex(R"(seed (\d+))"))) << a.err;
  ASSERT_TRUE(std::regex_search(b.err, mb, std::regex(R"(seed (\d+))"))) << b.err;
  EXPECT_NE(ma[1], mb[1]) << "two runs drew the same seed";
  EXPECT_EQ(count(a.err, "[kvgraph] seed "), 1u) << a.err;
  RunResult again = run_cli_with_input(flags + " --seed " + ma[1].str(), "Once upon a time\n");
  EXPECT_EQ(again.out, a.out);
  EXPECT_THAT(again.err, Not(HasSubstr("seed ")));  // given, so not reported
}

TEST(CliChat, RepeatPenaltyIsOffByDefault) {
  const std::string in = "la la la la la la la la\n";
  RunResult dflt = run_cli_with_input(kGreedy + "-n 30", in);
  RunResult off = run_cli_with_input(kGreedy + "-n 30 --repeat-penalty 1", in);
  RunResult on = run_cli_with_input(kGreedy + "-n 30 --repeat-penalty 1.1", in);
  ASSERT_EQ(dflt.exit_code, 0) << dflt.err;
  EXPECT_EQ(dflt.out, off.out);
  EXPECT_NE(on.out, off.out) << "this prompt cannot tell whether a penalty is applied";
}

TEST(CliChat, QuietHidesBannerSeedAndStats) {
  RunResult loud = run_cli_with_input(kGreedy + "-n 10", "Hello\n");
  RunResult quiet = run_cli_with_input(kGreedy + "-n 10 -q", "Hello\n");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_THAT(loud.err, HasSubstr("/help"));
  EXPECT_EQ(turn_stats(loud.err).size(), 1u);
  EXPECT_EQ(quiet.err, "");
  EXPECT_EQ(quiet.out, loud.out);
}

TEST(CliChat, EndOfInputEndsTheOutputWithANewline) {
  RunResult empty = run_cli_with_input(kGreedy, "");
  EXPECT_EQ(empty.exit_code, 0) << empty.err;
  EXPECT_EQ(empty.out, "> \n");
  // A last line without a newline is still a message.
  RunResult r = run_cli_with_input(kGreedy + "-n 8", "Hello");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(turn_stats(r.err).size(), 1u) << r.err;
  EXPECT_THAT(r.out, EndsWith("\n> \n"));
}

namespace {

// A chat started with pipes on stdin and stdout (stderr to a file), so a test
// can type, watch the reply and send signals.
class LiveChat {
 public:
  LiveChat(const std::string& args, const fs::path& err) : err_(err) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(e, STDERR_FILENO);
      for (int fd : {in[0], in[1], out[0], out[1], e}) close(fd);
      signal(SIGINT, SIG_DFL);
      execl("/bin/sh", "sh", "-c", ("exec " + std::string(KVGRAPH_CLI) + " " + args).c_str(), (char*)nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    in_ = in[1];
    out_ = out[0];
  }
  ~LiveChat() {
    if (in_ >= 0) close(in_);
    if (out_ >= 0) close(out_);
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  void type(const std::string& s) { ASSERT_EQ(write(in_, s.data(), s.size()), static_cast<ssize_t>(s.size())); }
  void end_input() {
    close(in_);
    in_ = -1;
  }
  void signal_int() { kill(pid_, SIGINT); }

  // Reads stdout until `done(everything read so far)` or end of output;
  // false after `seconds` without that.
  bool read_until(const std::function<bool(const std::string&)>& done, double seconds = 60) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!done(out_text)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      ssize_t n = read(out_, buf, sizeof buf);
      if (n <= 0) return done(out_text);
      out_text.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  bool read_to_end(double seconds = 60) {
    bool eof = false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!eof && std::chrono::steady_clock::now() < until) {
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      ssize_t n = read(out_, buf, sizeof buf);
      if (n <= 0)
        eof = true;
      else
        out_text.append(buf, static_cast<size_t>(n));
    }
    return eof;
  }
  // The exit status (-1: killed by a signal, or still running after `seconds`).
  int wait_exit(double seconds = 30) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) return -1;
      usleep(10000);
    }
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string err() const { return slurp(err_); }

  std::string out_text;

 private:
  fs::path err_;
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  bool reaped_ = false;
};

// SIGPIPE ignored while a test writes to a child that may have died.
struct IgnoreSigpipe {
  IgnoreSigpipe() { old = signal(SIGPIPE, SIG_IGN); }
  ~IgnoreSigpipe() { signal(SIGPIPE, old); }
  sighandler_t old;
};

}  // namespace

TEST(CliChat, CtrlCStopsTheReplyNotTheProgram) {
  // "la la ..." greedily repeats "la" for thousands of tokens (the 4000-token
  // cache would take seconds to fill); Ctrl-C comes after the first few.
  IgnoreSigpipe guard;
  TempDir dir;
  LiveChat chat(kGreedy + "--max-tokens 100000 --capacity 4000", dir.path() / "err.txt");
  chat.type("la la la la la la la la\n");
  ASSERT_TRUE(chat.read_until([](const std::string& o) { return o.size() >= 2 + 30; })) << chat.err();
  chat.signal_int();
  // The reply ends and the next prompt comes.
  ASSERT_TRUE(chat.read_until([](const std::string& o) { return o.size() > 3 && o.ends_with("\n> "); }))
      << chat.out_text.substr(0, 200) << "\n" << chat.err();
  // The conversation goes on ("A computer is" alone ends within 40 tokens).
  chat.type("/reset\nA computer is\n");
  chat.end_input();
  EXPECT_TRUE(chat.read_to_end());
  EXPECT_EQ(chat.wait_exit(), 0) << chat.err();
  const std::string err = chat.err();
  EXPECT_THAT(err, HasSubstr("reply interrupted after"));
  auto turns = turn_stats(err);
  ASSERT_EQ(turns.size(), 2u) << err;
  EXPECT_LT(turns[0].generated, 3000) << err;
  EXPECT_THAT(chat.out_text, EndsWith("\n> \n"));
}

TEST(CliChat, CtrlCAtThePromptEndsTheChat) {
  IgnoreSigpipe guard;
  TempDir dir;
  LiveChat chat(kGreedy, dir.path() / "err.txt");
  ASSERT_TRUE(chat.read_until([](const std::string& o) { return o == "> "; })) << chat.err();
  chat.signal_int();
  EXPECT_TRUE(chat.read_to_end());
  EXPECT_EQ(chat.wait_exit(), 0) << chat.err();
  EXPECT_EQ(chat.out_text, "> \n");
}
