// Embedding kvgraph: `embed MODEL_DIR PROMPT` streams a greedy continuation
// of PROMPT from a Hugging Face model folder (CPU) to stdout.
#include <cstdio>
#include <exception>

#include "kvgraph/session.h"
#include "kvgraph/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: embed MODEL_DIR PROMPT\n");
    return 2;
  }
  try {
    auto model = kvgraph::Model::load(argv[1], kvgraph::Device::CPU);
    auto tokenizer = kvgraph::Tokenizer::from_file(model->dir());
    std::vector<int32_t> prompt = tokenizer.encode(argv[2]);
    kvgraph::GenerateOptions options{.max_tokens = 64, .stop = {"\n\n"}};
    kvgraph::Session session(
        model, {.capacity = kvgraph::request_capacity(model->config(), prompt.size(), options.max_tokens)});
    // Greedy is the default sampling (temperature 0); see session.sampling().
    auto result = session.generate(prompt, &tokenizer, options, [](int32_t, std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    std::fprintf(stderr, "[embed] %zu tokens, finished by %s\n", result.tokens.size(),
                 kvgraph::finish_reason_name(result.finish));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
