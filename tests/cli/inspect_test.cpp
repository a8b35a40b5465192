// kvgraph inspect: the table comes from the config and the checkpoint's
// headers (no weights are built), and --check-weights finds NaN/inf values.
#include <sys/resource.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/model.h"
#include "support/files.h"
#include "support/fixtures.h"
#include "support/run.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path copy_model(const fs::path& src, const TempDir& dir) {
  const fs::path dst = dir.path() / "model";
  fs::copy(src, dst, fs::copy_options::recursive);
  return dst;
}

// Overwrites element `i` of tensor `name` in a safetensors file with `bytes`
// (the element's width), in place.
void poke(const fs::path& file, const std::string& name, int64_t i, const std::string& bytes) {
  const SafetensorsParts parts = read_safetensors(file);
  const std::string whole = read_file(file);
  uint64_t n = 0;
  std::memcpy(&n, whole.data(), 8);
  const size_t at = 8 + n + parts.header.at(name)["data_offsets"][0].get<size_t>() + size_t(i) * bytes.size();
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void expect_one_line_error(const RunResult& r, int code, const std::string& what) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  EXPECT_THAT(r.err, StartsWith("kvgraph: error: "));
  EXPECT_THAT(r.err, HasSubstr(what));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

fs::path default_model() { return fs::path(KVGRAPH_SOURCE_DIR) / "models" / "default"; }

}  // namespace

TEST(Inspect, ASyntheticModelIsDescribedWithoutBuildingItsWeights) {
  // It used to build all 4.9 GB of f32 weights (13 s, 4.8 GB peak) to print this.
  const RunResult r = run_cli("inspect -m synthetic:llama3.2-1b");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Llama 3.2 1B: 1,235,814,400 parameters, in f32 on the CPU.
  EXPECT_THAT(r.out, HasSubstr(fmt::format("weights     {:.1f} MB on cpu (f32)", 1235814400.0 * 4 / 1e6)));
  EXPECT_THAT(r.out, HasSubstr("16 layers, hidden 2048, ffn 8192, heads 32 / kv 8 x 64, vocab 128256"));
  rusage children{};
  ASSERT_EQ(getrusage(RUSAGE_CHILDREN, &children), 0);
  EXPECT_LT(children.ru_maxrss, 512 * 1024) << "peak resident KB of the CLI runs";  // ru_maxrss is in KB
}

TEST(Inspect, ReportsTheWeightsLoadWouldMake) {
  for (const auto& fam : fixture_families()) {
    const fs::path dir = fixtures_dir() / fam;
    const RunResult r = run_cli("inspect -m " + dir.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto m = Model::load(dir, Device::CPU);
    EXPECT_THAT(r.out, HasSubstr(fmt::format("weights     {:.1f} MB on cpu (f32)", m->weight_bytes() / 1e6))) << fam;
    EXPECT_THAT(r.out, HasSubstr(fmt::format("{} layers", m->config().num_layers))) << fam;
  }
}

TEST(Inspect, AFileInsteadOfAModelDirectoryIsNamedAsSuch) {
  const fs::path file = fixtures_dir() / "llama" / "config.json";
  expect_one_line_error(run_cli("inspect -m " + file.string()), 1,
                        "[model] expected a model directory (config.json and *.safetensors), got the file " +
                            file.string());
}

TEST(InspectCheckWeights, ACleanCheckpointPasses) {
  const fs::path dir = fixtures_dir() / "qwen2";
  const SafetensorsParts parts = read_safetensors(dir / "model.safetensors");
  const RunResult r = run_cli("inspect --check-weights -m " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(fmt::format("check       {} tensors, {:.1f} MB: every value finite",
                                           parts.header.size() - parts.header.count("__metadata__"),
                                           parts.data.size() / 1e6)));
  EXPECT_EQ(r.err, "");
}

TEST(InspectCheckWeights, NamesTheFirstNanWithItsTensorAndIndex) {
  TempDir dir;
  const fs::path m = copy_model(fixtures_dir() / "llama", dir);  // f32
  const std::string name = "model.layers.1.mlp.down_proj.weight";
  const json shape = read_safetensors(m / "model.safetensors").header.at(name)["shape"];
  ASSERT_EQ(shape, json({64, 128}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  poke(m / "model.safetensors", name, 300, std::string(reinterpret_cast<const char*>(&nan), 4));

  const RunResult r = run_cli("inspect --check-weights -m " + m.string());
  // 300 = 2 * 128 + 44.
  expect_one_line_error(r, 1, "[weights] tensor \"" + name +
                                  "\" in model.safetensors has NaN at element 300 (index [2, 44] of shape [64, 128])");
  EXPECT_THAT(r.out, HasSubstr("total KV"));  // the table came first
  EXPECT_EQ(run_cli("inspect -m " + m.string()).exit_code, 0);  // without the flag, values are not read
}

TEST(InspectCheckWeights, FindsInfinityInABf16Checkpoint) {
  TempDir dir;
  const fs::path m = copy_model(default_model(), dir);  // bf16
  const std::string name = "model.layers.3.self_attn.o_proj.weight";
  const json entry = read_safetensors(m / "model.safetensors").header.at(name);
  ASSERT_EQ(entry["dtype"], "BF16");
  ASSERT_EQ(entry["shape"], json({256, 256}));
  const uint16_t inf = 0xFF80;  // bf16 -inf
  poke(m / "model.safetensors", name, 1000, std::string(reinterpret_cast<const char*>(&inf), 2));
  // 1000 = 3 * 256 + 232.
  expect_one_line_error(run_cli("inspect --check-weights -q -m " + m.string()), 1,
                        "tensor \"" + name + "\" in model.safetensors has -inf at element 1000 (index [3, 232]");
}

TEST(InspectCheckWeights, ASyntheticModelHasNoWeightsToCheck) {
  const RunResult r = run_cli("inspect --check-weights -m synthetic:qwen2.5-0.5b");
  expect_one_line_error(r, 2, "[cli] --check-weights reads a checkpoint's stored values; synthetic:qwen2.5-0.5b has none");
}
