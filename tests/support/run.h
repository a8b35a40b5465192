#pragma once
// Runs the kvgraph CLI as a user would and captures what it printed.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace kvgraph::testing {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `args` is appended to the binary path as written (shell quoting is the
// caller's).
inline RunResult run_cli(const std::string& args) {
  static int n = 0;
  auto dir = std::filesystem::temp_directory_path();
  auto out = dir / ("kvgraph_cli_out_" + std::to_string(getpid()) + "_" + std::to_string(n));
  auto err = dir / ("kvgraph_cli_err_" + std::to_string(getpid()) + "_" + std::to_string(n++));
  std::string cmd = std::string(KVGRAPH_CLI) + " " + args + " >" + out.string() + " 2>" + err.string() + " </dev/null";
  int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

// As run_cli, with `input` as standard input (a chat session, say).
inline RunResult run_cli_with_input(const std::string& args, const std::string& input) {
  static int n = 0;
  auto dir = std::filesystem::temp_directory_path();
  const std::string tag = std::to_string(getpid()) + "_" + std::to_string(n++);
  auto in = dir / ("kvgraph_cli_stdin_" + tag), out = dir / ("kvgraph_cli_stdout_" + tag),
       err = dir / ("kvgraph_cli_stderr_" + tag);
  std::ofstream(in, std::ios::binary) << input;
  std::string cmd = std::string(KVGRAPH_CLI) + " " + args + " <" + in.string() + " >" + out.string() + " 2>" +
                    err.string();
  int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  for (const auto& p : {in, out, err}) std::filesystem::remove(p);
  return r;
}

}  // namespace kvgraph::testing
