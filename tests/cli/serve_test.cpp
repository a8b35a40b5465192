// `kvgraph serve` as a user runs it: it prints where it listens, answers, and
// shuts down cleanly on SIGTERM / SIGINT; bad flags and a model that cannot
// load are one error line and a non-zero exit.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "support/run.h"

using namespace kvgraph::testing;
using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace {

// `kvgraph serve ARGS` in the background, its stdout on a pipe.
class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& args) {
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      std::vector<char*> argv;
      std::string exe = KVGRAPH_CLI, serve = "serve";
      argv.push_back(exe.data());
      argv.push_back(serve.data());
      std::vector<std::string> copy = args;
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(exe.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    out_ = fdopen(out[0], "r");
  }
  ~ServeProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_) fclose(out_);
  }

  // The port from the "listening on http://HOST:PORT" line (-1 at EOF).
  int port() {
    char line[512];
    if (!fgets(line, sizeof line, out_)) return -1;
    std::cmatch m;
    if (!std::regex_search(line, m, std::regex("listening on http://127\\.0\\.0\\.1:([0-9]+)"))) return -1;
    return std::stoi(m[1]);
  }

  // Sends `sig`; the exit status, or -1 if it did not exit within `timeout`.
  int stop(int sig, std::chrono::milliseconds timeout) {
    kill(pid_, sig);
    const auto end = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < end) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  bool reaped_ = false;
};

bool healthy(int port) {
  httplib::Client c("127.0.0.1", port);
  for (int i = 0; i < 500; ++i) {
    auto r = c.Get("/health");
    if (r && r->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void expect_one_line_error(const RunResult& r, int code, const std::string& what) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  EXPECT_THAT(r.err, StartsWith("kvgraph: error: "));
  EXPECT_THAT(r.err, HasSubstr(what));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace

TEST(CliServe, ServesAndStopsCleanlyOnSignals) {
  for (int sig : {SIGTERM, SIGINT}) {
    ServeProcess p({"--port", "0", "-q", "--parallel", "2"});
    const int port = p.port();
    ASSERT_GT(port, 0);
    ASSERT_TRUE(healthy(port));
    httplib::Client c("127.0.0.1", port);
    auto r = c.Post("/v1/completions", R"({"prompt": "Once", "max_tokens": 4})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(p.stop(sig, std::chrono::seconds(10)), 0) << "signal " << sig;
  }
}

TEST(CliServe, BadFlagsAreUsageErrors) {
  expect_one_line_error(run_cli("serve --parallel 0"), 2, "--parallel 0");
  expect_one_line_error(run_cli("serve --port 70000"), 2, "--port 70000");
  expect_one_line_error(run_cli("serve --ctx -5"), 2, "--ctx -5");
  expect_one_line_error(run_cli("serve --queue-timeout -1"), 2, "--queue-timeout");
  expect_one_line_error(run_cli("serve --ctx 64 --capacity 128"), 2, "disagree");
}

TEST(CliServe, AModelThatCannotLoadIsAnErrorExit) {
  const RunResult r = run_cli("serve --port 0 -m /nonexistent/model");
  expect_one_line_error(r, 1, "/nonexistent/model");
  EXPECT_THAT(r.out, HasSubstr("listening on"));  // it listened, then the load failed
}

TEST(CliServe, APortInUseIsAnErrorExit) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  expect_one_line_error(run_cli("serve --port " + std::to_string(port)), 1, "cannot listen on 127.0.0.1:" + std::to_string(port));
  close(fd);
}
