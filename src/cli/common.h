#pragma once
// Shared pieces of the kvgraph subcommands: model resolution and loading
// with progress, session options from flags, timing.
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "kvgraph/tokenizer.h"

namespace kvgraph::cli {

// Flags every model-running command shares.
struct ModelFlags {
  std::string model;        // dir, synthetic:NAME, or empty for the embedded default
  std::string device = "cpu";
  int capacity = 0;         // 0: prompt + new tokens (generate) or model maximum
  int chunk = 64;           // prefill step (max_write)
  std::string kv_dtype;     // f32 | bf16 | f16; default f32 on CPU, bf16 on CUDA
  std::string cpu_weights = "auto";  // auto | f32 | bf16 (Model::CpuWeights)
  bool eager = false;
  bool quiet = false;
  std::string tune;         // Tuning::parse spec; empty: the defaults
  void add(CLI::App& app);
  DType kv_storage(Device d) const;
  Tuning tuning() const { return Tuning::parse(tune); }
};

std::filesystem::path default_model_dir();
std::shared_ptr<Model> load_model(const ModelFlags& f, double* seconds = nullptr);
std::optional<Tokenizer> load_tokenizer(const Model& m, bool required);
std::vector<int32_t> parse_ids(const std::string& text, const std::string& what);
std::string read_file(const std::filesystem::path& p, const std::string& what);

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Subcommands (src/cli/commands/*.cpp).
void add_generate(CLI::App& app);
void add_chat(CLI::App& app);
void add_score(CLI::App& app);
void add_perplexity(CLI::App& app);
void add_inspect(CLI::App& app);
void add_bench(CLI::App& app);

}  // namespace kvgraph::cli
