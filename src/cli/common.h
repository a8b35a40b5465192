#pragma once
// Shared pieces of the kvgraph subcommands: model resolution and loading
// with progress, session options from flags, timing.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/op_types.h"
#include "kvgraph/session.h"
#include "kvgraph/tokenizer.h"

namespace kvgraph::cli {

// A bad command line (a flag's value out of range, a missing or unknown
// flag): main prints it as one line and exits 2, where runtime errors exit 1.
class UsageError : public Error {
 public:
  using Error::Error;
};

// usage_fail("--chunk {}: expected an integer >= 1", 0) throws
// UsageError("[cli] --chunk 0: expected an integer >= 1").
template <typename... Args>
[[noreturn]] inline void usage_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format("[cli] {}", fmt::format(f, std::forward<Args>(args)...)));
}

// Throws UsageError "[cli] FLAG VALUE: expected an integer >= MIN" (then
// `note`, e.g. " (0: off)") when value < min.
void check_at_least(const char* flag, int64_t value, int64_t min, const char* note = "");

// ops::check under the flags' names (--temperature, --top-k, --top-p,
// --repeat-penalty): throws UsageError for the first one out of range.
void check_sampling_flags(const ops::SamplingParams& p);

// Flags every model-running command shares.
struct ModelFlags {
  std::string model;        // dir, synthetic:NAME, or empty for the embedded default
  std::string device = "cpu";
  int capacity = 0;         // 0: prompt + new tokens (generate) or model maximum
  int chunk = 0;            // --chunk as given; 0: not given (prefill_chunk() picks)
  bool chunk_given = false;
  std::string kv_dtype;     // K and V: f32 | bf16 | f16 | int8 | int4 | fp8; default f32 on CPU, bf16 on CUDA
  std::string k_dtype, v_dtype;  // one of them only (over --kv-dtype)
  int kv_group = 64;        // of int8 / int4 KV: 32 or 64 values per scale and bias
  std::string cpu_weights = "auto";  // auto | f32 | bf16 (Model::CpuWeights)
  std::string weights;      // empty or bf16: as stored; int8 | int4: quantized on load (MLX affine)
  int group_size = 64;      // of --weights int8|int4: 32, 64 or 128
  bool eager = false;
  bool quiet = false;
  std::string tune;         // Tuning::parse spec; empty: the defaults
  void add(CLI::App& app);
  void check() const;       // ranges of --capacity and --chunk (UsageError); before any work
  // The prefill step (Session max_write): --chunk, else 512 tokens on cuda
  // (tensor-core prefill: 3.5x the tokens/s of 64-token steps on the 8B
  // shape) and 64 on the cpu (prefix reuse keeps whole steps, and re-prefilling
  // up to 511 tokens a chat turn costs seconds there).
  int prefill_chunk() const;
  KvStorage kv_storage(Device d) const;  // of --kv-dtype / --k-dtype / --v-dtype / --kv-group
  // Throws UsageError when the KV formats cannot store this model's rows
  // (a group that does not divide head_dim, ...): before anything is allocated.
  void check_kv_storage(const ModelConfig& c, Device d) const;
  QuantFormat quantize() const;  // of --weights / --group-size (bits 0: as stored)
  Tuning tuning() const { return Tuning::parse(tune); }
};

std::filesystem::path default_model_dir();
// Loads the model; an explicit --capacity beyond the positions it was
// trained on (max_position_embeddings) warns once on stderr, as llama.cpp
// does when n_ctx > n_ctx_train.
std::shared_ptr<Model> load_model(const ModelFlags& f, double* seconds = nullptr);
std::optional<Tokenizer> load_tokenizer(const Model& m, bool required);
std::vector<int32_t> parse_ids(const std::string& text, const std::string& what);
// The whole file; a missing or unreadable file or a directory throws
// Error("[cli] WHAT: cannot open PATH: <strerror>") (or "... is a directory").
std::string read_file(const std::filesystem::path& p, const std::string& what);
// All of stdin (until end of file); a read error throws like read_file.
std::string read_stdin(const std::string& what);

// Output that must not be lost silently: every write, the flush and the
// close are checked, and a failure throws
// Error("[COMPONENT] cannot write NAME: <strerror>").
class Output {
 public:
  // A borrowed stream (stdout): flushed and checked by finish(), not closed.
  Output(std::FILE* borrowed, std::string name, std::string component);
  // A file created (or truncated) for writing; the open is checked too.
  Output(const std::filesystem::path& p, std::string name, std::string component);
  ~Output();  // closes an owned file unchecked (an error is already on its way)
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;

  void write(std::string_view bytes);
  void flush();   // hands the buffered bytes to the system (streamed text)
  void finish();  // flush, then close an owned file; both checked

 private:
  [[noreturn]] void fail_write(int err) const;
  std::FILE* f_ = nullptr;
  bool owned_ = false;
  std::string name_, component_;
};

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
void add_cache_prompt(CLI::App& app);
void add_quantize(CLI::App& app);
void add_serve(CLI::App& app);

}  // namespace kvgraph::cli
