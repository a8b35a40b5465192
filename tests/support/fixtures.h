#pragma once
// Reference checkpoints made by tools/make_fixtures.py with transformers.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvgraph::testing {

inline std::filesystem::path fixtures_dir() {
  return std::filesystem::path(KVGRAPH_SOURCE_DIR) / "tests" / "fixtures" / "models";
}

inline std::vector<std::string> fixture_families() {
  return {"llama", "qwen2", "mistral", "gemma2", "gemma3", "qwen3"};
}

struct Reference {
  std::vector<int32_t> ids, greedy_prompt, greedy, eos;
  int vocab = 0;
  std::vector<float> logits;  // [ids.size(), vocab]
};

inline Reference load_reference(const std::string& family) {
  auto dir = fixtures_dir() / family;
  std::ifstream in(dir / "reference.json");
  if (!in) throw std::runtime_error("missing fixture " + (dir / "reference.json").string() +
                                    " (make it with tools/make_fixtures.py)");
  nlohmann::json j = nlohmann::json::parse(in);
  Reference r;
  r.ids = j["ids"].get<std::vector<int32_t>>();
  r.greedy_prompt = j["greedy_prompt"].get<std::vector<int32_t>>();
  r.greedy = j["greedy"].get<std::vector<int32_t>>();
  if (j.contains("eos") && j["eos"].is_array()) r.eos = j["eos"].get<std::vector<int32_t>>();
  r.vocab = j["vocab"].get<int>();
  std::ifstream lb(dir / "logits.bin", std::ios::binary);
  r.logits.resize(r.ids.size() * r.vocab);
  lb.read(reinterpret_cast<char*>(r.logits.data()), r.logits.size() * sizeof(float));
  if (!lb) throw std::runtime_error("short logits.bin in " + dir.string());
  return r;
}

}  // namespace kvgraph::testing
