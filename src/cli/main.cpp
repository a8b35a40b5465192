// The kvgraph command line. Every failure is one line on stderr and a
// non-zero exit.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/common.h"

int main(int argc, char** argv) {
  CLI::App app{"kvgraph: graph-replayed LLM decoding with KV caches built for it"};
  app.require_subcommand(1);
  app.footer("Run `kvgraph <command> --help` for a command's options and examples.");
  kvgraph::cli::add_generate(app);
  kvgraph::cli::add_chat(app);
  kvgraph::cli::add_score(app);
  kvgraph::cli::add_perplexity(app);
  kvgraph::cli::add_inspect(app);
  kvgraph::cli::add_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    fmt::print(stderr, "kvgraph: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
