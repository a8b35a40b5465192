// kvgraph inspect: the model and its cache layout, worked out from config.json
// and the checkpoint's headers without building the weights; with
// --check-weights, every stored value is scanned for NaN and infinity.
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "cli/common.h"
#include "kvgraph/error.h"
#include "kvgraph/fp8.h"
#include "kvgraph/safetensors.h"

namespace kvgraph::cli {

namespace {

struct InspectFlags {
  ModelFlags m;
  bool check_weights = false;
  bool tensors = false;
};

bool is_synthetic(const std::string& model) { return model.rfind("synthetic:", 0) == 0; }

// What load_model would build, with the same checks, without reading a weight
// (a synthetic 1B model once took 13 s and 4.8 GB here to print this table).
ModelInfo describe(const ModelFlags& f) {
  const Device dev = parse_device(f.device);
  if (is_synthetic(f.model)) return Model::describe_synthetic(f.model.substr(10), dev, f.quantize());
  const Model::CpuWeights cw = f.cpu_weights == "f32"    ? Model::CpuWeights::f32
                               : f.cpu_weights == "bf16" ? Model::CpuWeights::bf16
                                                         : Model::CpuWeights::automatic;
  return Model::describe(f.model.empty() ? default_model_dir() : std::filesystem::path(f.model), dev, cw,
                         f.quantize());
}

// "[3, 17]": the position of flat element `i` in a row-major tensor of `shape`.
std::string unravel(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> at(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    at[d] = shape[d] > 0 ? i % shape[d] : 0;
    i = shape[d] > 0 ? i / shape[d] : 0;
  }
  return shape_string(at);
}

// Every tensor of the checkpoint (all of it: a vision tower too), in name
// order; fails at the first non-finite value with its tensor, file and index.
void check_weights(const std::filesystem::path& dir, bool quiet) {
  const WeightStore store(dir);
  const std::vector<std::string> names = store.names();
  size_t total = 0;
  // fp8 matrices: their codes, where 0x7F / 0xFF is NaN (e4m3 has no infinities).
  auto view = [&](const std::string& n) { return store.stored_dtype(n) == "F8_E4M3" ? store.get_e4m3(n) : store.get(n); };
  for (const std::string& n : names) total += view(n).nbytes;
  const bool bar = !quiet && isatty(STDERR_FILENO) && total >= (64u << 20);
  size_t done = 0;
  int last = -1;
  for (const std::string& n : names) {
    const WeightView w = view(n);
    if (store.stored_dtype(n) == "F8_E4M3") {
      const auto* c = reinterpret_cast<const uint8_t*>(w.data);
      for (int64_t i = 0; i < w.numel(); ++i)
        if (e4m3_is_nan(c[i])) {
          if (bar) fmt::print(stderr, "\n");
          fail("weights", "tensor \"{}\" in {} has NaN (fp8 code 0x{:02X}) at element {} (index {} of shape {})", n,
               store.file_of(n).filename().string(), c[i], i, unravel(i, w.shape), shape_string(w.shape));
        }
    } else if (auto i = first_non_finite(w)) {
      if (bar) fmt::print(stderr, "\n");
      float v = 0;
      widen_to_f32(w.data + *i * dtype_size(w.dtype), w.dtype, 1, &v);
      fail("weights", "tensor \"{}\" in {} has {} at element {} (index {} of shape {})", n,
           store.file_of(n).filename().string(), std::isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf", *i,
           unravel(*i, w.shape), shape_string(w.shape));
    }
    done += w.nbytes;
    const int pct = total ? static_cast<int>(100.0 * done / total) : 100;
    if (bar && pct != last) {
      last = pct;
      fmt::print(stderr, "\rchecking weights [{}{}] {:3d}% of {:.1f} GB", std::string(pct / 4, '#'),
                 std::string(25 - pct / 4, ' '), pct, total / 1e9);
      if (done >= total) fmt::print(stderr, "\n");
    }
  }
  fmt::print("check       {} tensors, {:.1f} MB: every value finite\n", names.size(), total / 1e6);
}

void run_inspect(const InspectFlags& f) {
  f.m.check();
  if (f.check_weights && is_synthetic(f.m.model)) {
    usage_fail("--check-weights reads a checkpoint's stored values; {} has none", f.m.model);
  }
  const ModelInfo info = describe(f.m);
  const ModelConfig& c = info.config;
  const int32_t capacity = f.m.capacity > 0 ? f.m.capacity : std::max(1, c.max_position_embeddings);
  f.m.check_kv_storage(c, info.device);
  const KvStorage kv = f.m.kv_storage(info.device);
  CacheConfig cc = cache_config(c, info.device, capacity, f.m.prefill_chunk(), kv);
  fmt::print("model       {} ({})\n", info.dir.empty() ? f.m.model : info.dir.string(), c.model_type);
  fmt::print("shape       {} layers, hidden {}, ffn {}, heads {} / kv {} x {}, vocab {}\n", c.num_layers,
             c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size);
  fmt::print("weights     {:.1f} MB on {} ({}{})\n", info.weight_bytes / 1e6, device_name(info.device),
             dtype_name(info.matrix_dtype),
             info.quantization.quantized()
                 ? fmt::format(", matrices {} affine{}", format_name(info.quantization, info.matrix_dtype),
                               info.quantized_checkpoint ? " as stored" : " quantized on load")
                 : "");
  if (info.fp8.quantized())
    fmt::print("checkpoint  {} matrices, {:.1f} MB on disk, dequantized at load to {}\n", fp8_format_name(info.fp8),
               info.checkpoint_bytes / 1e6, dtype_name(info.matrix_dtype));
  fmt::print("rope        theta {} ({}){}\n", c.rope.theta, c.rope.type,
             c.rope_local.theta != c.rope.theta ? fmt::format(", local theta {}", c.rope_local.theta) : "");
  fmt::print("cache       capacity {} tokens, chunk {}, storage {}\n", capacity, f.m.prefill_chunk(), kv_storage_name(kv));
  // Bytes per token of a layer: K and V rows of every KV head, with the
  // scales (and biases) of the quantized formats; total: the pools as allocated.
  fmt::print("{:>5}  {:<40} {:>12} {:>14}\n", "layer", "policy", "bytes/token", "total bytes");
  size_t total = 0, total_bf16 = 0;
  for (size_t l = 0; l < cc.layers.size(); ++l) {
    const auto& L = cc.layers[l];
    const size_t per = size_t(L.n_kv_heads) * size_t(kv.k.row_bytes(L.head_dim) + kv.v.row_bytes(L.head_dim));
    const size_t bytes = per * L.policy.pool();
    total += bytes;
    total_bf16 += size_t(L.n_kv_heads) * L.head_dim * 4 * L.policy.pool();
    fmt::print("{:>5}  {:<40} {:>12} {:>14}\n", l, L.policy.describe(), per, bytes);
  }
  fmt::print("total KV    {:.2f} MB at capacity {} ({:.2f}x the bytes of bf16 K/V)\n", total / 1e6, capacity,
             double(total) / double(total_bf16));
  if (f.tensors) {
    // "stored": the checkpoint's format and bytes; "format"/"bytes": on the device.
    fmt::print("{:<64} {:<16} {:<9} {:>14} {:<24} {:>14}\n", "tensor", "shape", "format", "bytes", "stored",
               "stored bytes");
    size_t sum = 0, stored_sum = 0;
    for (const ModelInfo::Tensor& t : info.tensors) {
      fmt::print("{:<64} {:<16} {:<9} {:>14} {:<24} {:>14}\n", t.name, shape_string(t.shape), t.format, t.bytes,
                 t.stored, t.stored_bytes);
      sum += t.bytes;
      stored_sum += t.stored_bytes;
    }
    fmt::print("{:<64} {:<16} {:<9} {:>14} {:<24} {:>14}\n", fmt::format("{} tensors", info.tensors.size()), "", "",
               sum, "", stored_sum);
  }
  if (f.check_weights) {
    std::fflush(stdout);  // the table first, whatever the check finds
    check_weights(info.dir, f.m.quiet);
  }
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto f = std::make_shared<InspectFlags>();
  CLI::App* c = app.add_subcommand("inspect", "Show the model and its per-layer cache layout");
  c->footer("Examples:\n  kvgraph inspect --capacity 4096\n  kvgraph inspect -m DIR --check-weights");
  f->m.add(*c);
  c->add_flag("--tensors", f->tensors, "Also list every weight tensor: shape, format (f32, bf16, int4/g64, ...) and bytes");
  c->add_flag("--check-weights", f->check_weights,
              "Also scan every stored weight for NaN or infinity (fails at the first, naming the tensor and index)");
  c->callback([f] { run_inspect(*f); });
}

}  // namespace kvgraph::cli
