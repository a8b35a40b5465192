// A config that does not describe its checkpoint is an error naming the
// tensors it would ignore, never a model that silently runs without them.
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "support/fixtures.h"
#include "support/load_error.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using ::testing::HasSubstr;

namespace {

// The fixture's checkpoint beside its config.json, with `edit` applied.
std::filesystem::path with_config(const TempDir& dir, const std::string& family,
                                  const std::function<void(nlohmann::json&)>& edit) {
  const auto src = fixtures_dir() / family;
  std::filesystem::copy_file(src / "model.safetensors", dir.path() / "model.safetensors");
  nlohmann::json c = nlohmann::json::parse(std::ifstream(src / "config.json"));
  edit(c);
  std::ofstream(dir.path() / "config.json") << c.dump();
  return dir.path();
}

}  // namespace

TEST(UnusedTensors, FewerLayersThanTheCheckpointIsAnError) {
  TempDir dir;
  const auto p = with_config(dir, "llama", [](nlohmann::json& c) { c["num_hidden_layers"] = 1; });
  const std::string e = load_error(p);
  EXPECT_THAT(e, HasSubstr("[weights]"));
  EXPECT_THAT(e, HasSubstr("not used by the model config.json describes"));
  EXPECT_THAT(e, HasSubstr("\"model.layers.1."));
  EXPECT_THAT(e, HasSubstr("1 layers"));
}

TEST(UnusedTensors, TheWrongFamilyIsAnError) {
  // A Gemma 2 checkpoint read as Llama: its sandwich norms would be ignored.
  TempDir dir;
  const auto p = with_config(dir, "gemma2", [](nlohmann::json& c) { c["model_type"] = "llama"; });
  const std::string e = load_error(p);
  EXPECT_THAT(e, HasSubstr("not used"));
  EXPECT_THAT(e, HasSubstr("feedforward_layernorm"));
}

TEST(UnusedTensors, TheFixturesThemselvesLoad) {
  for (const auto& f : fixture_families()) EXPECT_NO_THROW(Model::load(fixtures_dir() / f, Device::CPU)) << f;
}
