// kvgraph inspect: the model and its cache layout.
#include <fmt/format.h>

#include "cli/common.h"
#include "kvgraph/error.h"

namespace kvgraph::cli {

namespace {

struct InspectFlags {
  ModelFlags m;
};

void run_inspect(const InspectFlags& f) {
  f.m.check();
  auto model = load_model(f.m);
  const ModelConfig& c = model->config();
  const int32_t capacity = f.m.capacity > 0 ? f.m.capacity : std::max(1, c.max_position_embeddings);
  const DType kv = f.m.kv_storage(model->device());
  CacheConfig cc = model->cache_config(capacity, f.m.chunk, kv);
  fmt::print("model       {} ({})\n", model->dir().empty() ? f.m.model : model->dir().string(), c.model_type);
  fmt::print("shape       {} layers, hidden {}, ffn {}, heads {} / kv {} x {}, vocab {}\n", c.num_layers,
             c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size);
  fmt::print("weights     {:.1f} MB on {} ({})\n", model->weight_bytes() / 1e6, device_name(model->device()),
             dtype_name(model->matrix_dtype()));
  fmt::print("rope        theta {} ({}){}\n", c.rope.theta, c.rope.type,
             c.rope_local.theta != c.rope.theta ? fmt::format(", local theta {}", c.rope_local.theta) : "");
  fmt::print("cache       capacity {} tokens, chunk {}, storage {}\n", capacity, f.m.chunk, dtype_name(kv));
  fmt::print("{:>5}  {:<40} {:>12} {:>14}\n", "layer", "policy", "bytes/token", "total bytes");
  size_t total = 0;
  for (size_t l = 0; l < cc.layers.size(); ++l) {
    const auto& L = cc.layers[l];
    const size_t per = 2ull * L.n_kv_heads * L.head_dim * dtype_size(kv);
    const size_t bytes = per * L.policy.pool();
    total += bytes;
    fmt::print("{:>5}  {:<40} {:>12} {:>14}\n", l, L.policy.describe(), per, bytes);
  }
  fmt::print("total KV    {:.2f} MB at capacity {}\n", total / 1e6, capacity);
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto f = std::make_shared<InspectFlags>();
  CLI::App* c = app.add_subcommand("inspect", "Show the model and its per-layer cache layout");
  c->footer("Example:\n  kvgraph inspect --capacity 4096");
  f->m.add(*c);
  c->callback([f] { run_inspect(*f); });
}

}  // namespace kvgraph::cli
