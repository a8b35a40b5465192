// kvgraph quantize: a float checkpoint written quantized in MLX's layout
// (quantize_checkpoint in src/models/loader.cpp), for kvgraph and MLX to load.
#include <unistd.h>

#include <fmt/format.h>

#include "cli/common.h"
#include "kvgraph/error.h"

namespace kvgraph::cli {

namespace {

struct QuantizeFlags {
  std::string model, output;
  int bits = 4, group = 64;
  bool quiet = false;
};

void run_quantize(const QuantizeFlags& f) {
  if (f.bits != 4 && f.bits != 8) usage_fail("--bits {}: expected 4 or 8", f.bits);
  if (f.group != 32 && f.group != 64 && f.group != 128) usage_fail("--group-size {}: expected 32, 64 or 128", f.group);
  const std::filesystem::path dir = f.model.empty() ? default_model_dir() : std::filesystem::path(f.model);
  const bool bar = !f.quiet && isatty(STDERR_FILENO);
  int last = -1;
  const auto t0 = std::chrono::steady_clock::now();
  const QuantizeSummary s = quantize_checkpoint(dir, f.output, {f.bits, f.group}, [&](size_t done, size_t total) {
    if (!bar || total == 0) return;
    const int pct = static_cast<int>(100.0 * done / total);
    if (pct == last) return;
    last = pct;
    fmt::print(stderr, "\rquantizing {} [{}{}] {:3d}%", dir.filename().string(), std::string(pct / 4, '#'),
               std::string(25 - pct / 4, ' '), pct);
    if (done >= total) fmt::print(stderr, "\n");
  });
  if (!f.quiet)
    fmt::print(stderr, "[kvgraph] wrote {}: {} matrices int{} in groups of {}, {} tensors copied; {:.1f} MB -> {:.1f} MB "
               "in {:.1f} s\n", f.output, s.quantized, f.bits, f.group, s.copied, s.bytes_in / 1e6, s.bytes_out / 1e6,
               seconds_since(t0));
}

}  // namespace

void add_quantize(CLI::App& app) {
  auto f = std::make_shared<QuantizeFlags>();
  CLI::App* c = app.add_subcommand("quantize", "Write a float checkpoint quantized (MLX affine layout)");
  c->add_option("-m,--model", f->model, "Model directory (default: the embedded model)");
  c->add_option("-o,--output", f->output, "Output directory (must not exist, or be empty)")->required();
  c->add_option("--bits", f->bits, "Bits per weight: 4 or 8")->capture_default_str();
  c->add_option("--group-size", f->group, "Values per scale and bias: 32, 64 or 128")->capture_default_str();
  c->add_flag("-q,--quiet", f->quiet, "No progress on stderr");
  c->footer(
      "Every matrix the model multiplies by (embedding and lm_head included) whose input dim the group divides is\n"
      "written as MLX writes it (X.weight u32 codes, X.scales, X.biases); the rest is copied, with the tokenizer\n"
      "files. Loading the result gives the same model as `--weights intB --group-size G` on the original.");
  c->callback([f] { run_quantize(*f); });
}

}  // namespace kvgraph::cli
