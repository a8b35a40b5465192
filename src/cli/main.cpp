// The kvgraph command line. Every failure is one line on stderr,
// "kvgraph: error: [component] ...", and a non-zero exit: 2 for a bad
// command line (usage), 1 for a failure while running. Output that could not
// be written (a full disk, a closed pipe's end) is a failure too.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/common.h"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

// Prints "kvgraph: error: MESSAGE" as exactly one line.
void print_error(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';
  while (!message.empty() && message.back() == ' ') message.pop_back();
  fmt::print(stderr, "kvgraph: error: {}\n", message);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvgraph: graph-replayed LLM decoding with KV caches built for it"};
  app.require_subcommand(1);
  // KVGRAPH_VERSION: the CMake project version, defined on this executable.
  app.set_version_flag("--version", std::string("kvgraph ") + KVGRAPH_VERSION, "Print the version and exit");
  app.footer("Run `kvgraph <command> --help` for a command's options and examples.");
  kvgraph::cli::add_generate(app);
  kvgraph::cli::add_chat(app);
  kvgraph::cli::add_score(app);
  kvgraph::cli::add_perplexity(app);
  kvgraph::cli::add_inspect(app);
  kvgraph::cli::add_bench(app);
  kvgraph::cli::add_cache_prompt(app);
  kvgraph::cli::add_quantize(app);
  kvgraph::cli::add_serve(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version: on stdout, exit 0
    // CLI11's own errors (unknown flag, a value that does not convert, a
    // missing argument) in the one-line form, with where to look.
    std::string where = "kvgraph";
    for (const CLI::App* sub : app.get_subcommands()) where += " " + sub->get_name();
    if (app.get_subcommands().empty() && argc > 1 && argv[1][0] != '-') {
      // CLI11 would say "A subcommand is required" for a misspelt command.
      std::string known;
      for (const CLI::App* sub : app.get_subcommands({})) known += (known.empty() ? "" : ", ") + sub->get_name();
      print_error(fmt::format("[cli] unknown command \"{}\": expected one of {} (see `kvgraph --help`)", argv[1], known));
      return kExitUsage;
    }
    print_error(fmt::format("[cli] {} (see `{} --help`)", e.what(), where));
    return kExitUsage;
  } catch (const kvgraph::cli::UsageError& e) {
    print_error(e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    print_error(e.what());
    return kExitRuntime;
  }
  // Whatever a command printed must have reached stdout (commands that
  // stream check as they go; this catches the rest at the last moment).
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    print_error(fmt::format("[cli] cannot write to stdout: {}", std::strerror(errno ? errno : EIO)));
    return kExitRuntime;
  }
  return 0;
}
