// libFuzzer target: config.json text through parse_model_config (the parser
// load_model_config uses), then what the loader derives from the result:
// RoPE inverse frequencies for both layer kinds and the attention scale.
//
// Contract under test: any text either parses into a ModelConfig whose
// invariants hold, or throws kvgraph::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvgraph/error.h"
#include "kvgraph/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const kvgraph::ModelConfig cfg = kvgraph::parse_model_config(text);
    // What parse_model_config promises its callers.
    if (cfg.num_layers <= 0 || cfg.num_heads <= 0 || cfg.num_kv_heads <= 0 || cfg.head_dim <= 0 ||
        cfg.head_dim % 2 != 0 || cfg.num_heads % cfg.num_kv_heads != 0 ||
        static_cast<int>(cfg.layer_window.size()) != cfg.num_layers) {
      std::abort();
    }
    for (int w : cfg.layer_window) {
      if (w < 0) std::abort();
    }
    // RoPE tables have head_dim / 2 entries; a huge head_dim is valid JSON that
    // the loader rejects against the weights' shapes before building them.
    if (cfg.head_dim <= 4096) {
      (void)kvgraph::rope_inv_freq(cfg.rope, cfg.head_dim);
      (void)kvgraph::rope_inv_freq(cfg.rope_local, cfg.head_dim);
    }
    (void)cfg.attention_scale();
  } catch (const kvgraph::Error&) {
    // Malformed or unsupported config: the expected outcome.
  }
  return 0;
}
