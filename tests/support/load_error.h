#pragma once
// The loader's error for a checkpoint a test wrote or edited.
#include <filesystem>
#include <string>

#include "kvgraph/model.h"
#include "support/errors.h"
#include "support/mlx_checkpoint.h"
#include "support/temp_dir.h"

namespace kvgraph::testing {

// The message of loading `dir` on the CPU, quantizing on load to `quantize`
// ("" when it loads).
inline std::string load_error(const std::filesystem::path& dir, QuantFormat quantize = {}) {
  return error_of([&] { Model::load(dir, Device::CPU, {}, Model::CpuWeights::automatic, quantize); });
}

// As above for `m`, written to a fresh directory under `tmp`.
inline std::string load_error(const TempDir& tmp, const MlxCheckpoint& m, QuantFormat quantize = {}) {
  static int n = 0;
  const std::filesystem::path dir = tmp.path() / ("case" + std::to_string(n++));
  write_checkpoint(dir, m);
  return load_error(dir, quantize);
}

}  // namespace kvgraph::testing
